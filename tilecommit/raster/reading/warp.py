"""A warped job's grid, and the upload seen on it: warped by GDAL with the exact transformer.

:func:`web_optimized_grid` is the grid ``rio cogeo create --web-optimized`` makes (rio-cogeo
7.0.4, ``rio_cogeo.utils.get_web_optimized_params`` with its defaults): WebMercatorQuad
(EPSG:3857), the zoom level whose resolution is closest to the source's as GDAL would warp it
("auto" zoom level strategy, morecantile's ``zoom_for_res``), the bounds widened to the tiles of
that zoom which hold the source's corners (no aligned levels). :func:`srs_grid` is the grid of
``gdalwarp -t_srs CRS -tr RES RES -tap`` (``target_srs``, ``resolution``). Either is a pure function
of the source version and the job's options, so every activity of a job computes the same one.

:func:`warped` opens the upload on that grid as a GDAL warped VRT whose transformer is GDAL's
exact one (gdalwarp's ``-et 0``), written here as the VRT's XML because rasterio 1.4.4 cannot
make one: its ``WarpedVRT`` with ``tolerance=0`` and a given grid leaves the transformer unset
(GDAL: "pfnTransformer is NULL"), and ``rasterio.warp.reproject`` always wraps the transformer in
the approximating one, 0.125 pixel of error, whatever is asked. With the exact transformer each
output pixel's source position is computed on its own, so reading one window of the VRT gives
the pixels a warp of the whole scene gives there, for the kernels that use the source pixels
under an output pixel alone (nearest, average, mode, rms: tilecommit/warping.py says why the
wider ones are refused); GDAL reads the source window each chunk needs, the kernel's margin
included. Nothing is written: the VRT is opened from text.

A source whose valid area is an alpha band has that band declared to the warper as the source's
and the output's alpha, as rasterio's WarpedVRT declares it for rio-cogeo (``SrcAlphaBand``,
``DstAlphaBand``): the warper weighs each source pixel by its alpha, and a window's pixels and
alpha are still the whole scene's (measured with nearest, average and mode; docs/raster.md,
'An alpha band').
``add_mask`` on such a source reads it through the warper on its own grid (:func:`view_grid`), as
rio-cogeo does, nearest and exact: each pixel its own, 0 where the alpha is.
"""

from __future__ import annotations

import math
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.dtypes import _gdal_typename
from rasterio.enums import MaskFlags
from rasterio.vrt import WarpedVRT
from rasterio.warp import calculate_default_transform, transform, transform_bounds
from rasterio.windows import Window as RioWindow

from .alpha import alpha_band
from .source import prefetch_window, reads_through, source_of
from .upload import format_of_driver

#: The tile matrix set of ``--web-optimized`` (rio-cogeo's default ``tms``).
TILE_MATRIX_SET = "WebMercatorQuad"
#: Finest zoom considered, as rio-cogeo asks ``zoom_for_res``.
MAX_ZOOM = 30
#: GDAL's names of the warp kernels (GDALWarpOptions' ResampleAlg in a VRT's XML).
GDAL_KERNELS = {
    "nearest": "NearestNeighbour",
    "average": "Average",
    "mode": "Mode",
    # GDAL's name: its VRT reader takes a ResampleAlg it does not know for nearest, silently.
    "rms": "RootMeanSquare",
}
#: Edge of the warped VRT's blocks: the warper works a block at a time, and a window (a multiple
#: of 256) is then whole blocks.
WARP_BLOCK = 256
#: Memory the warper may use for one chunk (GDAL's default, 64 MB).
WARP_MEMORY = 64 * 1024 * 1024
#: Points sampled along each edge of a window to find the source pixels it maps back to.
EDGE_SAMPLES = 21
#: Source pixels added around them: the kernels' reach, with room for the edges' curvature.
PREFETCH_MARGIN = 2

#: The dataset each open warped VRT warps (its tags, colours and palette are the outputs').
_ORIGINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class TargetGrid:
    """The output grid of a warped job: CRS, transform, size and, web-optimized, the zoom it is at."""

    crs: CRS
    transform: Affine
    width: int
    height: int
    #: The WebMercatorQuad zoom of a web-optimized grid; None for a grid of target_srs/resolution.
    zoom: int | None = None
    #: The source's own grid (:func:`source_grid`): nothing is moved, the warper only applies the
    #: source's alpha band as ``add_mask`` asks.
    is_source_grid: bool = False

    def tags(self) -> dict[str, str]:
        """The tiling scheme tags rio-cogeo writes on a web-optimized COG (none for another grid)."""
        if self.zoom is None:
            return {}
        return {"TILING_SCHEME_NAME": TILE_MATRIX_SET, "TILING_SCHEME_ZOOM_LEVEL": str(self.zoom)}

    @property
    def name(self) -> str:
        if self.is_source_grid:
            return "own grid"
        if self.zoom is not None:
            return f"WebMercatorQuad grid at zoom {self.zoom}"
        return f"{self.crs.to_string()} grid of {self.transform.a:g}-unit pixels"


def tile_matrix_set():
    """morecantile's WebMercatorQuad, imported here: morecantile loads every tile matrix set it
    ships when imported (about 0.18 s), which a job that does not warp to it should not pay."""
    import morecantile

    return morecantile.tms.get(TILE_MATRIX_SET)


def web_optimized_grid(src) -> TargetGrid:
    """The grid ``rio cogeo create --web-optimized`` gives ``src`` (the module's notes).

    Step for step rio-cogeo's ``get_web_optimized_params``: the bounds and resolution GDAL
    suggests for the warp to EPSG:3857 (``GDALSuggestedWarpOutput2``, through a WarpedVRT made
    for nothing else), the zoom whose resolution is closest to the coarser of the two axes, and
    the tiles of that zoom holding the upper-left and lower-right corners.
    """
    import morecantile  # see tile_matrix_set

    tms = tile_matrix_set()
    crs = tms.rasterio_crs
    if src.crs != crs:
        with WarpedVRT(src, crs=crs) as suggested:
            bounds, pixel = suggested.bounds, suggested.transform
    else:
        bounds, pixel = src.bounds, src.transform
    zoom = tms.zoom_for_res(max(abs(pixel.a), abs(pixel.e)), max_z=MAX_ZOOM, zoom_level_strategy="auto")
    # morecantile's _tile is the tile holding a point given in the set's CRS: what rio-cogeo calls.
    upper_left = tms._tile(bounds[0], bounds[3], zoom)
    west, _, _, north = tms.xy_bounds(upper_left)
    lower_right = tms._tile(bounds[2], bounds[1], zoom)
    east, _, _, south = tms.xy_bounds(morecantile.Tile(lower_right.x + 1, lower_right.y + 1, zoom))
    resolution = tms.matrix(zoom).cellSize
    grid = Affine(resolution, 0, west, 0, -resolution, north)
    width = max(1, round((east - west) / grid.a))
    height = max(1, round((south - north) / grid.e))
    return TargetGrid(crs=crs, transform=grid, width=width, height=height, zoom=zoom)


def srs_grid(src, crs: CRS | None, resolution: float | None) -> TargetGrid:
    """The grid of ``gdalwarp -t_srs crs -tr resolution resolution -tap`` for ``src``, its extent PROJ's.

    The extent is the source's bounds in ``crs`` as PROJ computes them (rasterio's
    ``transform_bounds``, 21 points an edge, poles and the antimeridian handled), where gdalwarp
    samples the edges itself (``GDALSuggestedWarpOutput2``, whose raw extent rasterio does not
    return): the two can differ by a fraction of a pixel. Without ``resolution``, the pixel size
    GDAL suggests for the warp (rasterio's ``calculate_default_transform``). Then, as ``-tap``, the
    extent widened to multiples of the pixel size and the pixel count rounded as gdalwarp rounds it:
    two scenes at one resolution share a pixel grid. ``crs`` None: the source's.
    """
    crs = crs or src.crs
    left, bottom, right, top = transform_bounds(src.crs, crs, *src.bounds, densify_pts=21)
    if right <= left or top <= bottom:
        raise ValueError(f"the source's bounds in {crs.to_string()} wrap around ({left}, {bottom}, {right}, {top})")
    size = resolution
    if size is None:
        suggested, _, _ = calculate_default_transform(src.crs, crs, src.width, src.height, *src.bounds)
        size = max(abs(suggested.a), abs(suggested.e))
    west, east = math.floor(left / size) * size, math.ceil(right / size) * size
    south, north = math.floor(bottom / size) * size, math.ceil(top / size) * size
    width = max(1, int((east - west + size / 2) / size))
    height = max(1, int((north - south + size / 2) / size))
    return TargetGrid(crs=crs, transform=Affine(size, 0, west, 0, -size, north), width=width, height=height)


def target_grid(src, choice) -> TargetGrid:
    """The grid a job made with the profile ``choice`` (one that warps) puts ``src`` on."""
    if choice.web_optimized:
        return web_optimized_grid(src)
    crs = CRS.from_user_input(choice.target_srs) if choice.target_srs else None
    return srs_grid(src, crs, choice.resolution)


def source_grid(src) -> TargetGrid:
    """``src``'s own grid, for a window read through the warper without moving a pixel."""
    return TargetGrid(crs=src.crs, transform=src.transform, width=src.width, height=src.height, is_source_grid=True)


def view_grid(src, choice) -> TargetGrid | None:
    """The grid a job made with the profile ``choice`` reads ``src``'s windows on through the
    warper, or None (read as it is): the target grid of a choice that warps; the source's own
    for ``add_mask`` on a source whose valid area is an alpha band, which rio-cogeo turns into
    the mask through a WarpedVRT of the source on its own grid, so the warper's alpha semantics
    apply there too (what is fully transparent becomes 0)."""
    if choice.warped:
        return target_grid(src, choice)
    if choice.add_mask and alpha_band(src) is not None:
        return source_grid(src)
    return None


def _geotransform(transform: Affine) -> str:
    return ",".join(repr(float(v)) for v in transform.to_gdal())


def _add_exact_transformer(options: ET.Element, src, grid: TargetGrid) -> None:
    """GDAL's general image transformer from ``grid`` to ``src``'s pixels, not wrapped in the
    approximating one (whose ``<ApproxTransformer>`` element GDAL writes around it otherwise)."""
    transformer = ET.SubElement(ET.SubElement(options, "Transformer"), "GenImgProjTransformer")
    ET.SubElement(transformer, "SrcGeoTransform").text = _geotransform(src.transform)
    ET.SubElement(transformer, "SrcInvGeoTransform").text = _geotransform(~src.transform)
    ET.SubElement(transformer, "DstGeoTransform").text = _geotransform(grid.transform)
    ET.SubElement(transformer, "DstInvGeoTransform").text = _geotransform(~grid.transform)
    reprojection = ET.SubElement(ET.SubElement(transformer, "ReprojectTransformer"), "ReprojectionTransformer")
    ET.SubElement(reprojection, "SourceSRS").text = src.crs.to_wkt()
    ET.SubElement(reprojection, "TargetSRS").text = grid.crs.to_wkt()


def has_internal_mask(src) -> bool:
    """Whether ``src``'s valid area is an internal (per-dataset) mask, not an alpha band or nodata."""
    flags = src.mask_flag_enums
    return all(MaskFlags.per_dataset in f for f in flags) and not any(
        MaskFlags.alpha in f or MaskFlags.nodata in f for f in flags
    )


def exact_warp_xml(
    src,
    grid: TargetGrid,
    *,
    resampling: str,
    nodata: float | None,
    alpha: bool = False,
    src_alpha: int | None = None,
    block: int = WARP_BLOCK,
    open_options: dict | None = None,
) -> str:
    """A VRTWarpedDataset of ``src`` on ``grid`` whose transformer is GDAL's exact one.

    ``nodata``: the value that marks no data in the source and fills the output where no source
    pixel falls (as rio-cogeo warps with ``src_nodata`` and ``nodata`` both that value); None:
    the output is 0 there, unmasked, as rio-cogeo's is for a source without nodata or mask.
    ``alpha``: one band more, the alpha band the warper makes (255 where a valid source pixel
    fell, 0 elsewhere), as rio-cogeo's ``add_alpha`` for a source with an internal mask; the
    warper takes the source's internal mask as its validity by itself. ``src_alpha``: the
    source's alpha band, declared to the warper as the source's and the output's alpha
    (``SrcAlphaBand``, ``DstAlphaBand``), as rasterio's WarpedVRT declares it for rio-cogeo: the
    warper weighs each source pixel by it, leaves a pixel whose alpha is 0 out, and writes the
    band as the alpha of what it warped (for nearest, the source pixel's). ``open_options``: those
    GDAL opens the source with, again, by its name (GDALDeserializeWarpOptions in
    alg/gdalwarper.cpp reads them from the warp options' ``OpenOptions``).
    """
    dtype = _gdal_typename(src.dtypes[0])
    root = ET.Element(
        "VRTDataset", rasterXSize=str(grid.width), rasterYSize=str(grid.height), subClass="VRTWarpedDataset"
    )
    ET.SubElement(root, "SRS").text = grid.crs.to_wkt()
    ET.SubElement(root, "GeoTransform").text = _geotransform(grid.transform)
    for band in src.indexes:
        element = ET.SubElement(root, "VRTRasterBand", dataType=dtype, band=str(band), subClass="VRTWarpedRasterBand")
        if nodata is not None:
            ET.SubElement(element, "NoDataValue").text = repr(float(nodata))
        if band == src_alpha:
            ET.SubElement(element, "ColorInterp").text = "Alpha"
    if alpha:
        element = ET.SubElement(
            root, "VRTRasterBand", dataType=dtype, band=str(src.count + 1), subClass="VRTWarpedRasterBand"
        )
        ET.SubElement(element, "ColorInterp").text = "Alpha"
    ET.SubElement(root, "BlockXSize").text = str(block)
    ET.SubElement(root, "BlockYSize").text = str(block)
    options = ET.SubElement(root, "GDALWarpOptions")
    ET.SubElement(options, "WarpMemoryLimit").text = str(WARP_MEMORY)
    ET.SubElement(options, "ResampleAlg").text = GDAL_KERNELS[resampling]
    ET.SubElement(options, "WorkingDataType").text = dtype
    ET.SubElement(options, "Option", name="INIT_DEST").text = "NO_DATA" if nodata is not None else "0"
    if nodata is not None:  # a pixel is no data when every band holds the value, as GDAL masks it
        ET.SubElement(options, "Option", name="UNIFIED_SRC_NODATA").text = "YES"
    ET.SubElement(options, "SourceDataset", relativeToVRT="0").text = src.name
    if open_options:
        listed = ET.SubElement(options, "OpenOptions")
        for key, value in open_options.items():
            ET.SubElement(listed, "OOI", key=key).text = str(value)
    _add_exact_transformer(options, src, grid)
    bands = ET.SubElement(options, "BandList")
    for band in src.indexes:
        mapping = ET.SubElement(bands, "BandMapping", src=str(band), dst=str(band))
        if nodata is not None:
            ET.SubElement(mapping, "SrcNoDataReal").text = repr(float(nodata))
            ET.SubElement(mapping, "DstNoDataReal").text = repr(float(nodata))
    if src_alpha is not None:
        ET.SubElement(options, "SrcAlphaBand").text = str(src_alpha)
        ET.SubElement(options, "DstAlphaBand").text = str(src_alpha)
    if alpha:
        ET.SubElement(options, "DstAlphaBand").text = str(src.count + 1)
    return ET.tostring(root, encoding="unicode")


@contextmanager
def warped(src, grid: TargetGrid, *, resampling: str, nodata: float | None) -> Iterator:
    """``src`` (open, and open until the block ends) seen on ``grid``: :func:`exact_warp_xml` opened.

    GDAL opens the source again by its name, so an upload opened through its pinned reader is
    read through that reader, every byte at the job's version and counted, and opened with the
    upload's own options (its format's, :attr:`~.upload.UploadFormat.open_options`): without NUM_THREADS=1 there,
    that dataset would take the environment's GDAL_NUM_THREADS and be decoded by GDAL's threads
    through the plugin (why they must not: :data:`~.source.UPLOAD_READ_THREADS`). A source whose valid
    area is an internal mask (and no nodata value is given) is seen with the warper's alpha band
    after its own (:func:`image_bands` are the others); one whose valid area is an alpha band,
    with that band warped as the warper's alpha (:func:`exact_warp_xml`'s ``src_alpha``).
    """
    alpha = nodata is None and has_internal_mask(src)
    src_alpha = alpha_band(src) if nodata is None else None
    source = source_of(src)
    xml = exact_warp_xml(
        src,
        grid,
        resampling=resampling,
        nodata=nodata,
        alpha=alpha,
        src_alpha=src_alpha,
        open_options=dict(format_of_driver(src.driver).open_options) if source is not None else None,
    )
    with rasterio.open(xml) as dataset:
        _ORIGINS[dataset] = (src, grid)
        reads_through(dataset, source)
        yield dataset


def source_window(view, window: RioWindow) -> RioWindow | None:
    """The source pixels ``window`` of the warped ``view`` maps back to, from points along its
    edges (exact transformation), with a margin, clipped to the source; None when no point maps.

    Only what to fetch ahead: GDAL's warper decides what it reads (a window over a pole of the
    source may need more), and any block missed here is fetched when GDAL asks for it.
    """
    src, grid = _ORIGINS[view]
    steps = [i / (EDGE_SAMPLES - 1) for i in range(EDGE_SAMPLES)]
    left, top = window.col_off, window.row_off
    right, bottom = left + window.width, top + window.height
    edge = [(left + (right - left) * t, top) for t in steps] + [(left + (right - left) * t, bottom) for t in steps]
    edge += [(left, top + (bottom - top) * t) for t in steps] + [(right, top + (bottom - top) * t) for t in steps]
    xs, ys = zip(*(grid.transform * point for point in edge), strict=True)
    sx, sy = transform(grid.crs, src.crs, list(xs), list(ys))
    pixels = [~src.transform * p for p in zip(sx, sy, strict=True) if all(map(math.isfinite, p))]
    if not pixels:
        return None
    cols, rows = zip(*pixels, strict=True)
    col0 = max(0, math.floor(min(cols)) - PREFETCH_MARGIN)
    row0 = max(0, math.floor(min(rows)) - PREFETCH_MARGIN)
    col1 = min(src.width, math.ceil(max(cols)) + PREFETCH_MARGIN)
    row1 = min(src.height, math.ceil(max(rows)) + PREFETCH_MARGIN)
    if col1 <= col0 or row1 <= row0:
        return None
    return RioWindow(col0, row0, col1 - col0, row1 - row0)


def prefetch(dataset, window: RioWindow) -> None:
    """Fetch ahead the upload's blocks a read of ``window`` of ``dataset`` will ask for: its own
    for an upload, those under :func:`source_window` for a warped view of one."""
    if dataset not in _ORIGINS:
        prefetch_window(dataset, window)
        return
    needed = source_window(dataset, window)
    if needed is not None:
        prefetch_window(origin_of(dataset), needed)


def image_bands(dataset) -> list[int]:
    """The bands of ``dataset`` that are image, not the alpha band a warped view adds."""
    return list(origin_of(dataset).indexes)


def origin_of(dataset):
    """The dataset ``dataset`` warps, or ``dataset`` itself when it is no warped view."""
    return _ORIGINS.get(dataset, (dataset, None))[0]


def grid_of(dataset) -> TargetGrid | None:
    """The grid a warped view is on (None for any other dataset)."""
    return _ORIGINS.get(dataset, (None, None))[1]
