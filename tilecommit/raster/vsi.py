"""Byte-level access to any path GDAL can open (local, ``/vsiaz/``, ``/vsimem/``), through GDAL itself.

rasterio exposes datasets, not files, so it cannot say whether a path is a zero-byte blob or
what its first bytes are. Those two facts turn GDAL's one message for every unreadable input
("not recognized as being in a supported file format") into a precise one. The functions are
GDAL's own VSI API, reached with ctypes through the library rasterio is linked against (so the
same configuration, credentials and /vsiaz/ settings apply), and only used to explain a refusal.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

import rasterio._base


@lru_cache(maxsize=1)
def _gdal() -> ctypes.CDLL | None:
    try:
        # dlsym on an extension module also searches the libraries it links: rasterio's libgdal.
        lib = ctypes.CDLL(rasterio._base.__file__)
        lib.VSIFOpenL.restype = ctypes.c_void_p
        lib.VSIFOpenL.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.VSIFSeekL.restype = ctypes.c_int
        lib.VSIFSeekL.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]
        lib.VSIFTellL.restype = ctypes.c_uint64
        lib.VSIFTellL.argtypes = [ctypes.c_void_p]
        lib.VSIFReadL.restype = ctypes.c_size_t
        lib.VSIFReadL.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
        lib.VSIFCloseL.restype = ctypes.c_int
        lib.VSIFCloseL.argtypes = [ctypes.c_void_p]
        return lib
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class FileProbe:
    """What GDAL's virtual file system sees at a path: does it exist, its size, its first bytes."""

    exists: bool
    size: int | None = None
    head: bytes = b""


def probe(path: str, head_bytes: int = 16) -> FileProbe | None:
    """Size and first bytes of ``path`` as GDAL sees it; None when the VSI API is unavailable.

    Call it inside the same :func:`rasterio.Env` as the failed open, so /vsiaz/ credentials apply.
    """
    lib = _gdal()
    if lib is None:
        return None
    handle = lib.VSIFOpenL(path.encode("utf-8"), b"rb")
    if not handle:
        return FileProbe(exists=False)
    try:
        lib.VSIFSeekL(handle, 0, 2)  # SEEK_END
        size = int(lib.VSIFTellL(handle))
        lib.VSIFSeekL(handle, 0, 0)
        buffer = ctypes.create_string_buffer(head_bytes)
        got = lib.VSIFReadL(buffer, 1, head_bytes, handle)
        return FileProbe(exists=True, size=size, head=buffer.raw[:got])
    finally:
        lib.VSIFCloseL(handle)


def file_size(path: str) -> int | None:
    found = probe(path, 0)
    return found.size if found and found.exists else None
