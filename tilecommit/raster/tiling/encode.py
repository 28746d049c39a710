"""What a tile's bytes are: one window of a source read exactly and encoded as a Cloud-Optimized GeoTIFF.

Tiles are encoded so the mosaic can be assembled from their compressed blocks without decoding
them (see :mod:`tilecommit.raster.assembly.mosaic`): 256-pixel blocks, the job's profile (by default
DEFLATE with the predictor that suits the sample type, :mod:`tilecommit.profiles`), and exactly as many internal overview levels as stay block-aligned in the
mosaic (:func:`tile_overview_count`), for edge windows too. Nothing here touches storage: the
render step (:mod:`.render`) commits what :func:`encode_tile` makes, and the VRT assembly and the
scrub encode with the same options.
"""

from __future__ import annotations

import time

import numpy as np
import rasterio
import rasterio.shutil
from rasterio.io import MemoryFile
from rasterio.windows import Window as RioWindow

from ... import profiles
from ...errors import ConfigurationError
from ...grid import Window
from ...spec import OutputSpec
from ..env import BLOCK_SIZE, NUM_THREADS
from ..gdal_errors import recording
from ..reading import metadata
from ..reading.alpha import alpha_band
from ..reading.scene import overview_resampling_for, read_classified
from ..reading.warp import grid_of, has_internal_mask, image_bands, origin_of, prefetch


def tile_overview_count(window_size: int, block_size: int = BLOCK_SIZE) -> int:
    """How many halvings of a window stay a whole number of blocks: the tile levels the mosaic can reuse.

    1024 with 256-pixel blocks gives 2 (512 and 256); 768 gives 0 (384 is not a multiple of 256).
    """
    if window_size % block_size:
        return 0
    blocks, levels = window_size // block_size, 0
    while blocks % 2 == 0:
        blocks //= 2
        levels += 1
    return levels


def cog_creation_options(
    dtype: str,
    *,
    block_size: int,
    overview_count: int,
    resampling: str,
    choice: profiles.Choice = profiles.DEFAULT_CHOICE,
    num_threads: int = NUM_THREADS,
) -> dict:
    """COG driver options for a tile made to the profile ``choice`` (its compression, level and
    predictor: :func:`tilecommit.profiles.creation_options`). Nothing in them varies between
    runs, so neither do the bytes.

    No overviews is said with OVERVIEWS=NONE: GDAL 3.10's COG driver fails with an unnamed error
    on OVERVIEW_COUNT=0 for an image larger than one block.
    """
    overviews = {"OVERVIEW_COUNT": overview_count} if overview_count else {"OVERVIEWS": "NONE"}
    return {
        "BLOCKSIZE": block_size,
        **profiles.creation_options(choice, dtype),
        **overviews,
        "OVERVIEW_RESAMPLING": resampling.upper(),
        # Copied when the source has them (they describe the whole scene, so the mosaic too),
        # never computed: statistics of one window would be wrong for the mosaic, which copies
        # this directory's tags. AUTO copies and does not compute (GDAL's COG driver docs).
        "STATISTICS": "AUTO",
        "BIGTIFF": "IF_SAFER",
        "NUM_THREADS": num_threads,
    }


def write_cog(src, path: str, options: dict, *, choice: profiles.Choice, dtype: str, block_size: int) -> None:
    """``src`` (a dataset or a path) as a COG at ``path``, every level encoded to ``choice``.

    The COG driver encodes the overviews through GTiff's ``*_OVERVIEW`` configuration options and
    sets them from its own options only where they are not set already (GDAL's cogdriver.cpp,
    ``CPLConfigOptionSetter(..., bSetOnlyIfUndefined=true)``); the app's environment names DEFLATE
    for them (env.py), which every other profile's overviews would otherwise get. So the
    profile's are set here, around the copy, and so is the overviews' block size (GTiff's
    GDAL_TIFF_OVR_BLOCKSIZE, 256 in the app's environment): the spec's, as the full resolution's.
    """
    with (
        recording() as messages,
        rasterio.Env(**profiles.overview_options(choice, dtype), GDAL_TIFF_OVR_BLOCKSIZE=block_size),
    ):
        rasterio.shutil.copy(src, path, driver="COG", **options)
    # GDAL only warns of a creation option its driver does not take, and writes the file without
    # it: a tile other than the profile's, committed create-only for good. Refused here instead.
    ignored = [m for m in messages if "does not support" in m and "creation option" in m]
    if ignored:
        raise ConfigurationError(
            f"GDAL's COG driver did not take the options of profile {choice.name!r} for {dtype} data "
            f"({'; '.join(ignored)}): the tile would not be the profile's, and none is written"
        )


def _per_dataset_mask(src) -> bool:
    """Whether a window of ``src`` has an internal mask to carry: the source's own, or, for a
    warped view, the alpha band the warper made of it (:mod:`~..reading.warp`)."""
    if grid_of(src) is not None:
        return src.count > len(image_bands(src))
    return has_internal_mask(src)


def mask_alpha(src, choice: profiles.Choice) -> int | None:
    """The band of ``src`` (a dataset :func:`~..tiling.render.window_of_upload` yields) that
    ``add_mask`` turns into the mask, as ``rio cogeo create --add-mask`` drops an alpha band
    into it: the alpha band that is the valid area of the upload ``src`` reads; None otherwise."""
    return alpha_band(origin_of(src)) if choice.add_mask else None


def tile_bands(src, choice: profiles.Choice) -> list[int]:
    """The bands of the upload ``src`` reads that a tile made with ``choice`` holds, in order."""
    dropped = mask_alpha(src, choice)
    return [band for band in image_bands(src) if band != dropped]


def _rio_window(window: RioWindow | Window) -> RioWindow:
    if isinstance(window, Window):
        return RioWindow(window.col_off, window.row_off, window.width, window.height)
    return window


def read_window(
    src, window: RioWindow | Window, *, choice: profiles.Choice = profiles.DEFAULT_CHOICE
) -> tuple[np.ndarray, np.ndarray | None]:
    """The pixels of exactly ``window`` of the open dataset ``src``, and the internal mask a tile
    of that window carries (None: none): what a tile made with the profile ``choice`` encodes.

    The mask is the source's per-dataset mask, as the profile's nodata options leave it, as
    ``rio cogeo create`` writes it: with ``nodata`` (the override of the source's nodata value)
    or ``add_mask``, a source's own mask is masked besides where every band holds the nodata
    value (the override, else the source's: rio-cogeo writes the mask of a warped VRT whose
    source nodata is that value, and GDAL's warper honours both); with ``add_mask``, a source
    without a mask of its own gets one, masked where every band holds the nodata value, all
    valid without one. With ``add_mask`` on an upload whose valid area is an alpha band, the
    tile holds the other bands and the mask is where that band, as the warper wrote it, is not 0
    (rio-cogeo writes the WarpedVRT's mask, which is that band, into a 1-bit mask: any value
    above 0 is valid); ``src`` is then the warper's view :func:`~.render.window_of_upload`
    yields, which leaves 0 where the alpha is.
    For an upload opened
    with :func:`~tilecommit.raster.reading.source.open_upload`, every byte is read at its version and counted
    (:func:`~tilecommit.raster.reading.scene.read_classified`)."""
    window = _rio_window(window)

    def read() -> tuple[np.ndarray, np.ndarray | None]:
        prefetch(src, window)
        return (
            src.read(image_bands(src), window=window),
            src.dataset_mask(window=window) if _per_dataset_mask(src) else None,
        )

    data, mask = read_classified(
        src,
        read,
        f"window {window} of {src.name}",
        lambda exc: (
            f"{src.name}: the pixels of window col={int(window.col_off)} row={int(window.row_off)} "
            f"{int(window.width)}x{int(window.height)} cannot be decoded ({exc}): the file is corrupt"
        ),
    )
    alpha = mask_alpha(src, choice)
    if alpha is not None:
        at = image_bands(src).index(alpha)
        return np.delete(data, at, axis=0), np.where(data[at] > 0, 255, 0).astype(np.uint8)
    if mask is None and not choice.add_mask:  # no internal mask, and none asked for
        return data, None
    if not choice.add_mask and choice.nodata is None:  # the source's own mask, as it is
        return data, mask
    valid = np.full(data.shape[1:], 255, np.uint8) if mask is None else mask
    nodata = choice.nodata_for(src.nodata)
    if nodata is not None:
        valid = np.where(holds_nodata(data, nodata), 0, valid).astype(np.uint8)
    return data, valid


def holds_nodata(data: np.ndarray, nodata: float) -> np.ndarray:
    """Where every band of ``data`` holds ``nodata``: the pixels GDAL masks by that value."""
    missing = np.isnan(data) if np.isnan(nodata) else data == data.dtype.type(nodata)
    return missing.all(axis=0)


def encode_tile(
    src,
    window: RioWindow | Window,
    *,
    spec: OutputSpec,
    num_threads: int = NUM_THREADS,
    pixels: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> tuple[bytes, dict]:
    """Read exactly ``window`` of the open dataset ``src`` and encode it as an in-memory COG
    made to the job's output ``spec`` (its block size, and the overview levels its window size allows).

    Returns the COG's bytes and the seconds spent reading and encoding. The same window of the
    same source always gives the same bytes: GDAL writes no timestamp or software tag into a
    COG, and every creation option is fixed here. ``pixels``: what :func:`read_window` already
    returned for this window of ``src``, so it is not read twice.
    """
    window = _rio_window(window)
    # A warped view's tags, colours and palette are its source's (what rio-cogeo carries too);
    # on the source's own grid, its CRS too, as read from the source (not the VRT's copy of it).
    about, grid = origin_of(src), grid_of(src)
    crs = src.crs if grid is not None and not grid.is_source_grid else about.crs
    started = time.perf_counter()
    data, mask = pixels if pixels is not None else read_window(src, window, choice=spec.choice)
    read_s = time.perf_counter() - started

    started = time.perf_counter()
    options = cog_creation_options(
        src.dtypes[0],
        block_size=spec.block_size,
        # GDAL's COG driver cannot make any overview of a single pixel (it fails with an unnamed
        # error): a 1 x 1 window (the corner of a scene one pixel past a window edge both ways)
        # gets none, and its mosaic is assembled through the VRT (the tiles' levels disagree).
        overview_count=0
        if window.width == window.height == 1
        else tile_overview_count(spec.window_size, spec.block_size),
        resampling=spec.overview_resampling(overview_resampling_for(about)),
        choice=spec.choice,
        num_threads=num_threads,
    )
    profile = {
        "driver": "MEM",
        "width": int(window.width),
        "height": int(window.height),
        "count": len(data),
        "dtype": src.dtypes[0],
        "crs": crs,
        "transform": src.window_transform(window),
        "nodata": spec.choice.output_nodata(src.nodata),
    }
    # The pixels go into a MEM dataset and the COG driver copies it, which is what rasterio's
    # buffered COG writer does on close; but rasterio.shutil.copy releases the GIL around
    # GDALCreateCopy and the writer's close does not, so here the encoding (most of a window's
    # CPU) runs beside the host's Python threads and the other activity slot's encoding.
    with rasterio.open("", "w", **profile) as staged:
        staged.write(data)
        if mask is not None:
            staged.write_mask(mask)
        metadata.carry(about, staged, bands=tile_bands(src, spec.choice))
        if grid is not None:
            staged.update_tags(**grid.tags())
        with MemoryFile() as memory:
            write_cog(staged, memory.name, options, choice=spec.choice, dtype=src.dtypes[0], block_size=spec.block_size)
            # One copy out of /vsimem/ (about 1 ms a 6 MB tile); MemoryFile.read() reads it in
            # steps holding the GIL (9-18 ms a tile, 1.3 CPU-s of a 10240² job, measured).
            body = bytes(memory.getbuffer())
    encode_s = time.perf_counter() - started
    return body, {"read": read_s, "encode": encode_s}
