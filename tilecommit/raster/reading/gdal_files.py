"""The one GDAL file system every :class:`~.source.Source` is read through: installed once, never removed.

GDAL names a file system by a path prefix (``/vsimem/``, ``/vsiaz/``) and looks the prefix up on
every call that names a path: ``VSIStatL``, ``VSIFOpenL``, ``GDALOpenEx``, and through them every
dataset open or create (rasterio opens ``""`` before it creates a MEM dataset, to delete what is
there). In GDAL 3.10 the prefixes live in one ``std::map`` that ``VSIFileManager::GetHandler``
walks while ``InstallHandler`` and ``RemoveHandler`` may insert and erase its nodes, no lock held
across either (``port/cpl_vsil.cpp``; read in the disassembly of the libgdal 3.10.3 that rasterio
1.4.4's wheel ships: each takes the manager's mutex only inside ``VSIFileManager::Get``, and
GetHandler then walks the map with ``_Rb_tree_increment``). rasterio releases the GIL around
``GDALOpenEx``, so the GIL does not order a walk against a change.

rasterio's ``opener`` (``_vsiopener.pyx``, ``_opener_registration``) installs a new prefix for
every dataset it opens and removes it when that dataset closes. With two activities in one
process, one closing an upload erased a node the other's ``GDALOpenEx`` was walking: the suite's
worker died with SIGSEGV in ``rasterio.open`` of a tile's MEM dataset. The fault is in the
sharing, not in either call, so it is fixed by sharing nothing that changes: this module installs
one prefix, :data:`PREFIX`, when it is first imported (the app imports it while indexing its
functions, before the host runs any), and never removes it. After that no read of the app
changes GDAL's map (``tests/test_gdal_files.py`` samples its prefixes while several threads
read).

A source is found under ``/vsitilecommit/<token>/<its path>`` (:func:`gdal_path`) while anything
holds it (a weak registry: an open dataset holds its source, :func:`~.source.open_upload`). The
callbacks run GDAL's requests against the source's plugin interface (``open``, ``isfile``,
``size``, and the handle's ``read``, ``seek``, ``tell``), the interface rasterio's bridge used,
with the same answers: no listing, no companion files, nothing written. Unlike rasterio's, the
registry is one per process: a dataset may be read from any thread (rasterio's lives in context
variables, so a file opened in one thread could only be read in that thread's context).

ctypes calls back into Python taking the GIL on whatever thread GDAL calls from (``CFUNCTYPE``:
``PyGILState_Ensure``), as rasterio's ``with gil`` callbacks do; an exception never crosses into
GDAL: each callback answers GDAL's failure value (-1, 0 bytes, NULL) and the source keeps the
fault it recorded (:meth:`~.source.Source.checked` raises it).
"""

from __future__ import annotations

import ctypes
import errno
import io
import itertools
import logging
import os
import platform
import stat
import threading
import weakref
from dataclasses import dataclass
from typing import Protocol

import rasterio

log = logging.getLogger(__name__)

#: The prefix of every path this file system answers for.
PREFIX = "/vsitilecommit/"

#: Where ``st_mode``, ``st_size`` and ``st_mtime`` sit in the ``struct stat`` GDAL passes
#: (VSIStatBufL is ``struct stat64``, which is ``struct stat`` on these 64-bit Linux ABIs), and its
#: size: glibc's ``bits/struct_stat.h`` for x86-64, and the generic layout of aarch64.
STAT_LAYOUTS = {
    "x86_64": {
        "size": 144,
        "st_mode": (24, ctypes.c_uint32),
        "st_size": (48, ctypes.c_int64),
        "st_mtime": (88, ctypes.c_int64),
    },
    "aarch64": {
        "size": 128,
        "st_mode": (16, ctypes.c_uint32),
        "st_size": (48, ctypes.c_int64),
        "st_mtime": (88, ctypes.c_int64),
    },
}

#: ``use_errno``: what a callback sets with ctypes.set_errno is the errno GDAL reads after it returns.
_STAT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, use_errno=True)
_READ_DIR = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
_OPEN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, use_errno=True)
_TELL = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)
_SEEK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int)
_READ = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_EOF = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_CLOSE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class _Callbacks(ctypes.Structure):
    """The head of GDAL's ``VSIFilesystemPluginCallbacksStruct`` (``port/cpl_vsi.h``), up to the
    last member this module sets. GDAL allocates the whole struct, zeroed
    (VSIAllocFilesystemPluginCallbacksStruct), and adds members only at its end, so a member left
    out stays NULL: not offered (unlink, rename, mkdir, rmdir, multi-range reads, range status,
    writes, sibling files)."""

    _fields_ = [
        ("pUserData", ctypes.c_void_p),
        ("stat", _STAT),
        ("unlink", ctypes.c_void_p),
        ("rename", ctypes.c_void_p),
        ("mkdir", ctypes.c_void_p),
        ("rmdir", ctypes.c_void_p),
        ("read_dir", _READ_DIR),
        ("open", _OPEN),
        ("tell", _TELL),
        ("seek", _SEEK),
        ("read", _READ),
        ("read_multi_range", ctypes.c_void_p),
        ("get_range_status", ctypes.c_void_p),
        ("eof", _EOF),
        ("write", ctypes.c_void_p),
        ("flush", ctypes.c_void_p),
        ("truncate", ctypes.c_void_p),
        ("close", _CLOSE),
    ]


class Source(Protocol):
    """What this file system serves: :class:`~.source.Source`'s plugin interface (rasterio's
    ``FileContainer``), for the one file at :attr:`path`."""

    path: str

    def isfile(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def mtime(self, path: str) -> int: ...
    def open(self, path: str, mode: str = "rb") -> io.RawIOBase: ...


@dataclass
class _Handle:
    """One file GDAL opened: the source's handle, and whether a read has come back short."""

    file: io.RawIOBase
    at_end: bool = False


_lock = threading.Lock()
_sources: weakref.WeakValueDictionary[str, Source] = weakref.WeakValueDictionary()
_paths: weakref.WeakKeyDictionary[Source, str] = weakref.WeakKeyDictionary()
_tokens = itertools.count(1)
_handles: dict[int, _Handle] = {}
_handle_ids = itertools.count(1)


def gdal_path(source: Source) -> str:
    """The path GDAL opens ``source`` by (the same one each call for the same source)."""
    with _lock:
        path = _paths.get(source)
        if path is None:
            token = str(next(_tokens))
            _sources[token] = source
            path = _paths[source] = f"{PREFIX}{token}/{source.path}"
    return path


def _source_for(name: bytes) -> tuple[Source | None, str]:
    """The registered source a path names, and the path within it (None: no such source)."""
    path = name.decode("utf-8", "surrogateescape")
    if path.startswith(PREFIX):
        path = path[len(PREFIX) :]
    token, _, rest = path.lstrip("/").partition("/")
    with _lock:
        return _sources.get(token), rest


def _handle(handle_id: int | None) -> _Handle:
    with _lock:
        return _handles[handle_id or 0]


# -- the callbacks: each answers GDAL's failure value rather than raise -------------------------


def _stat(_user_data, name, buffer, _flags) -> int:
    try:
        source, path = _source_for(name)
        if source is None or not source.isfile(path):
            ctypes.set_errno(errno.ENOENT)
            return -1
        size = source.size(path)
        ctypes.memset(buffer, 0, _STAT_LAYOUT["size"])
        for field, value in (("st_mode", stat.S_IFREG | 0o444), ("st_size", size), ("st_mtime", source.mtime(path))):
            offset, ctype = _STAT_LAYOUT[field]
            ctype.from_address(buffer + offset).value = value
        return 0
    except Exception:
        log.exception("stat of %r failed", name)
        return -1


def _read_dir(_user_data, _name, _max_files) -> None:
    return None  # no listing: GDAL finds no companion file beside a source


def _open(_user_data, name, access) -> int | None:
    try:
        source, path = _source_for(name)
        if source is None:
            raise FileNotFoundError(name)
        file = source.open(path, access.decode())
    except FileNotFoundError:
        ctypes.set_errno(errno.ENOENT)
        return None
    except Exception:
        log.exception("open of %r failed", name)
        return None
    with _lock:
        handle_id = next(_handle_ids)
        _handles[handle_id] = _Handle(file)
    return handle_id


def _tell(handle_id) -> int:
    try:
        return _handle(handle_id).file.tell()
    except Exception:
        log.exception("tell failed")
        return 0


def _seek(handle_id, offset, whence) -> int:
    try:
        handle = _handle(handle_id)
        handle.file.seek(offset, whence)
        handle.at_end = False
        return 0
    except Exception:
        log.exception("seek failed")
        return -1


def _read(handle_id, buffer, size, count) -> int:
    try:
        handle = _handle(handle_id)
        wanted = size * count
        data = handle.file.read(wanted)  # records a failed fetch and returns short, never raises one
        ctypes.memmove(buffer, data, len(data))
        handle.at_end = len(data) < wanted
        return len(data) // size if size else 0
    except Exception:
        log.exception("read failed")
        return 0


def _eof(handle_id) -> int:
    try:
        return int(_handle(handle_id).at_end)
    except Exception:
        log.exception("eof failed")
        return 1


def _close(handle_id) -> int:
    with _lock:
        _handles.pop(handle_id or 0, None)
    return 0


#: The prefix as GDAL holds it: the handler keeps this pointer, not a copy (``m_Prefix`` is a
#: ``const char *`` in GDAL 3.10's ``cpl_vsil_plugin.h``; a temporary's bytes, freed and reused,
#: made the handler refuse its own paths in some runs), so it lives as long as the process.
_PREFIX_C = ctypes.create_string_buffer(PREFIX.encode())
#: The ctypes thunks GDAL calls; kept for the life of the process, as GDAL keeps their addresses.
_CALLBACKS = {
    "stat": _STAT(_stat),
    "read_dir": _READ_DIR(_read_dir),
    "open": _OPEN(_open),
    "tell": _TELL(_tell),
    "seek": _SEEK(_seek),
    "read": _READ(_read),
    "eof": _EOF(_eof),
    "close": _CLOSE(_close),
}


def _stat_layout() -> dict:
    machine = platform.machine()
    if machine not in STAT_LAYOUTS:
        raise RuntimeError(f"no struct stat layout for {machine}: accepted {sorted(STAT_LAYOUTS)}")
    return STAT_LAYOUTS[machine]


#: This machine's layout, known at import (a machine whose struct stat is not known is refused there).
_STAT_LAYOUT = _stat_layout()


def loaded_libgdal() -> ctypes.CDLL:
    """The libgdal rasterio loaded (the one whose file systems GDAL's calls consult), by its path
    in this process's memory map; a second copy of GDAL would have a file manager of its own."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and os.path.basename(fields[5]).startswith("libgdal"):
                return ctypes.CDLL(fields[5])
    raise RuntimeError("rasterio is imported but no libgdal is mapped in this process")


def file_system_prefixes(gdal: ctypes.CDLL) -> list[str]:
    """Every prefix GDAL's file manager holds now (VSIGetFileSystemsPrefixes)."""
    gdal.VSIGetFileSystemsPrefixes.restype = ctypes.POINTER(ctypes.c_char_p)
    gdal.CSLDestroy.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
    listed = gdal.VSIGetFileSystemsPrefixes()
    try:
        prefixes: list[str] = []
        while listed[len(prefixes)] is not None:
            prefixes.append(listed[len(prefixes)].decode())
        return prefixes
    finally:
        gdal.CSLDestroy(listed)


def _install() -> None:
    # rasterio's first environment registers GDAL's drivers and installs rasterio's own file
    # system for Python file objects (/vsipythonfilelike/, once per process, _env.pyx): done here
    # too, so that change of GDAL's map happens at import as well, not beside a running job.
    with rasterio.Env():
        pass
    gdal = loaded_libgdal()
    if PREFIX in file_system_prefixes(gdal):
        # Imported a second time (a reload): GDAL's copy of the callbacks points at the first
        # import's thunks and registry, which a second registry would not reach.
        raise RuntimeError(f"{PREFIX} is installed in GDAL already: {__name__} is imported once per process")
    gdal.VSIAllocFilesystemPluginCallbacksStruct.restype = ctypes.POINTER(_Callbacks)
    gdal.VSIInstallPluginHandler.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Callbacks)]
    gdal.VSIFreeFilesystemPluginCallbacksStruct.argtypes = [ctypes.POINTER(_Callbacks)]
    callbacks = gdal.VSIAllocFilesystemPluginCallbacksStruct()
    for name, thunk in _CALLBACKS.items():
        setattr(callbacks.contents, name, thunk)
    try:
        if gdal.VSIInstallPluginHandler(_PREFIX_C, callbacks) != 0:
            raise RuntimeError(f"GDAL refused to install the file system {PREFIX}")
    finally:
        gdal.VSIFreeFilesystemPluginCallbacksStruct(callbacks)  # GDAL keeps a copy


_install()
