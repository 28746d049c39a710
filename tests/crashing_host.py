"""``python -m devhost`` killed at an exact point (crash-and-resume tests only).

    python -m tests.crashing_host N -- DEVHOST ARGS...

The process kills itself with SIGKILL when its N-th manifest row is about to be written: that
window's tile is already committed and its row is not, which is what a crash can leave behind.
The manifest's writer is replaced before the app is imported, so every module that calls it,
through the module or a name imported from it, calls the wrapper.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def install(n: int) -> None:
    from tilecommit import manifest

    original = manifest.record_manifest_entry
    lock = threading.Lock()
    calls = 0

    def record_manifest_entry(*args, **kwargs):
        nonlocal calls
        with lock:
            calls += 1
            if calls >= n:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    manifest.record_manifest_entry = record_manifest_entry


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--")
    (n,) = argv[:split]
    install(int(n))
    from devhost.cli import main as devhost_main

    return devhost_main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
