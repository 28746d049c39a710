"""GDAL configuration that bounds memory, set by the code for every raster operation.

The figures are the tuned ones of docs/design.md ('GDAL settings and raster figures'): with GDAL's defaults an assembly
of a 10240² x 3 uint16 scene peaks at 1.23 GB (2.7 GB at 20480²), over the Consumption plan's
1.5 GB; with these it stays near 270 MB whatever the scene size. Nothing is left to the process
environment, so a worker behaves the same on a laptop and in Azure.
"""

from __future__ import annotations

from typing import Any

import rasterio

from ..retries import gdal_http_options
from ..settings import Settings
from ..spec import DEFAULT_BLOCK_SIZE

#: Datasets GDAL keeps open at once (a VRT over hundreds of tiles would otherwise open them all).
MAX_DATASET_POOL_SIZE = 20
#: Bytes GDAL moves in one swath when copying a whole raster (CreateCopy).
SWATH_SIZE = 16 * 1024 * 1024
#: Bytes of source GDAL reads at once while computing one overview level.
OVR_CHUNK_MAX_SIZE = 4 * 1024 * 1024
#: Compression threads (libtiff compresses blocks independently, so output bytes do not depend
#: on it). Two: the Consumption plan's instance has about one vCPU, a dev box two cores.
NUM_THREADS = 2
#: Edge of the mosaic's (and each tile's) internal blocks: the one block size an output spec may
#: name (tilecommit/spec.py); a job's own value travels in its spec.
BLOCK_SIZE = DEFAULT_BLOCK_SIZE


def gdal_config(
    settings: Settings, gdal_options: dict | None = None, *, num_threads: int = NUM_THREADS
) -> dict[str, Any]:
    """The configuration options for :func:`rasterio.Env` (``gdal_options`` add storage access)."""
    config: dict[str, Any] = {
        # rasterio.Env applies GDAL_CACHEMAX with GDALSetCacheMax and restores it on exit; that
        # call takes bytes (an integer given to rasterio.Env is not read as megabytes, as GDAL's
        # configuration option is: 64 gave a 64-byte cache, and every read decoded its blocks anew).
        "GDAL_CACHEMAX": int(settings.gdal_cachemax_mb) * 2**20,
        "GDAL_MAX_DATASET_POOL_SIZE": MAX_DATASET_POOL_SIZE,
        "GDAL_SWATH_SIZE": SWATH_SIZE,
        "GDAL_OVR_CHUNK_MAX_SIZE": OVR_CHUNK_MAX_SIZE,
        # GDAL's one thread pool, for what reads only memory and local files: the warper's kernel,
        # overview building, GTiff's compression, and the decoding of a dataset opened without a
        # NUM_THREADS open option. Every dataset opened on an upload (or on a blob of the app's
        # own read through the same plugin) is opened with NUM_THREADS=1, which GTiff takes
        # before this option, so GDAL's threads never read through the plugin: which settings
        # make GDAL read with its pool, and why that deadlocks, is in reading/source.py
        # (UPLOAD_READ_THREADS).
        "GDAL_NUM_THREADS": num_threads,
        # No directory listing on open, and so no sidecar: GDAL looks for a file's .aux.xml, .ovr,
        # .msk, world file and the like only among the names a listing returned, and EMPTY_DIR
        # makes that list empty (one HEAD for a blob instead of a LIST of its container, too).
        # Sidecars uploaded next to a raster are never read with it (docs/uploads.md).
        "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
        # No VRT opened by the app (the mosaic's own) may run Python pixel functions or read a
        # raw file named in it; uploads are never opened as VRT at all (upload.py).
        "GDAL_VRT_ENABLE_PYTHON": "NO",
        "GDAL_VRT_ENABLE_RAWRASTERBAND": "NO",
        # GDAL retries a throttled or failed range read itself before reporting an error, as
        # many times as fit one storage call's budget (tilecommit/retries.py).
        **gdal_http_options(),
        # No .aux.xml read beside an input (its georeferencing or nodata would override the
        # file's own) nor written beside an output (a non-deterministic extra write).
        "GDAL_PAM_ENABLED": "NO",
        # Overviews built into an existing GeoTIFF (the mosaic's coarse levels): same encoding as the tiles.
        "GDAL_TIFF_OVR_BLOCKSIZE": BLOCK_SIZE,
        "COMPRESS_OVERVIEW": "DEFLATE",
        "ZLEVEL_OVERVIEW": 6,
        "INTERLEAVE_OVERVIEW": "PIXEL",
        "SPARSE_OK_OVERVIEW": "NO",
        # The COG driver builds a tile's overviews into a temporary file in /vsimem/ first, by
        # default ZSTD-compressed, and reads them back to encode them: with a small block cache
        # it decompresses that file again and again. Stored plain it costs a few MB of memory for
        # the moment of the encode, and 45 % less CPU per tile (0.219 -> 0.120 s for one
        # 1024² x 3 uint16 window, same bytes). A GDAL without this option falls back to ZSTD.
        "COG_TMP_COMPRESSION": "NONE",
    }
    config.update(gdal_options or {})
    return config


def gdal_env(settings: Settings, gdal_options: dict | None = None, **kwargs: Any) -> rasterio.Env:
    return rasterio.Env(**gdal_config(settings, gdal_options, **kwargs))
