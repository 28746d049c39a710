"""The Functions host's RPC messages, as Python protobuf classes.

The host and a language worker speak the messages of ``FunctionRpc.proto`` (with
``identity/ClaimsIdentityRpc.proto`` and ``shared/NullableTypes.proto``), kept in
Azure/azure-functions-language-worker-protobuf and copied into each worker; ours are the copy in
Azure/azure-functions-python-worker, azure_functions_worker/protos/_src/src/proto (``protos/``
beside this file, with that repository's license and the commit in ``protos/README.md``).
azure-functions-runtime ships no compiled classes: the caller passes its own in
``WorkerRequest.properties["protos"]`` (azure_functions_runtime/handle_event.py,
``worker_init_request``). They are compiled here with grpcio-tools' protoc into ``_generated/``
(gitignored) the first time they are needed, and again whenever a ``.proto`` file changes.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).parent
PROTOS = HERE / "protos"
GENERATED = HERE / "_generated"
PROTO_FILES = ("FunctionRpc.proto", "identity/ClaimsIdentityRpc.proto", "shared/NullableTypes.proto")
_lock = threading.Lock()
_loaded: SimpleNamespace | None = None


class ProtoCompileError(RuntimeError):
    pass


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for name in PROTO_FILES:
        digest.update(name.encode() + b"\0" + (PROTOS / name).read_bytes())
    return digest.hexdigest()


def compile_protos() -> Path:
    """Compile the ``.proto`` files into ``_generated/`` unless it holds this digest's output.

    protoc writes ``from identity import ...`` for an imported file; the imports are made
    relative, as the Python worker's own build does, so nothing is added to ``sys.path``."""
    stamp = GENERATED / "SOURCES.sha256"
    digest = _sources_digest()
    if stamp.exists() and stamp.read_text() == digest:
        return GENERATED
    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise ProtoCompileError(
            "grpcio-tools is needed to compile the worker's protos (requirements-worker.txt, Python 3.13)"
        ) from exc
    import grpc_tools

    GENERATED.mkdir(exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={GENERATED}", *PROTO_FILES]
    if protoc.main(args) != 0:
        raise ProtoCompileError(f"protoc failed on {', '.join(PROTO_FILES)}")
    for package in ("", "identity", "shared"):
        (GENERATED / package / "__init__.py").touch()
    for generated in GENERATED.rglob("*_pb2.py"):
        text = generated.read_text()
        fixed = re.sub(r"^from (identity|shared) import", r"from ..\1 import", text, flags=re.M)
        if generated.parent == GENERATED:
            fixed = re.sub(r"^from \.\.(identity|shared) import", r"from .\1 import", fixed, flags=re.M)
        generated.write_text(fixed)
    stamp.write_text(digest)
    return GENERATED


def protos() -> SimpleNamespace:
    """Every message class of the three files by name, as the worker reads ``protos.X``."""
    global _loaded
    with _lock:
        if _loaded is None:
            compile_protos()
            package = __name__.rsplit(".", 1)[0] + "._generated"
            modules = [
                importlib.import_module(f"{package}.FunctionRpc_pb2"),
                importlib.import_module(f"{package}.shared.NullableTypes_pb2"),
                importlib.import_module(f"{package}.identity.ClaimsIdentityRpc_pb2"),
            ]
            names = {}
            for module in modules:
                for name in module.DESCRIPTOR.message_types_by_name:
                    names[name] = getattr(module, name)
                for name in module.DESCRIPTOR.enum_types_by_name:
                    names[name] = getattr(module, name)
            _loaded = SimpleNamespace(**names)
        return _loaded


if __name__ == "__main__":  # `python -m devhost.worker.messages`: compile now (make setup)
    print(compile_protos(), file=sys.stderr)
