"""The mosaic's companions: a STAC item (projection, raster, eo and file extensions) and a PNG quicklook.

Both are pure functions of the committed mosaic (its pixels, size, checksum and creation time),
the item also of the scene the job inspected (its bands, CRS and acquisition time, which every
activity of the job is given as it was inspected), so a retry that regenerates them produces the
same bytes and its create-only commit agrees; the one exception is the item's
``tilecommit:cost`` (what the run that wrote it cost), which a check leaves out
(:func:`without_run_facts`). Its bands' statistics and histograms are read from one overview
level of the mosaic (:mod:`.statistics`) and so approximate, which ``tilecommit:statistics`` says;
an item stored by a build that made none is checked without them (:func:`comparable_items`).

The item's geometry is the footprint of the mosaic's valid pixels (:mod:`.footprint`); its
projection fields follow the projection extension: ``proj:code`` when an EPSG code is
equivalent to the CRS, else the CRS itself as ``proj:wkt2`` and ``proj:projjson``.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pystac
from pystac.extensions.eo import Band as EOBand
from pystac.extensions.eo import EOExtension
from pystac.extensions.file import FileExtension
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import DataType, Histogram, RasterBand, RasterExtension, Statistics
from rasterio.crs import CRS
from rasterio.errors import NotGeoreferencedWarning
from rasterio.io import MemoryFile

from ... import jobs, profiles
from ..gdal_errors import gdal_step
from ..reading.scene import SceneInfo, as_crs, same_crs
from ..reading.source import Source, reading
from .footprint import Footprint, footprint
from .statistics import BandStatistics, MosaicStatistics
from .strategy import MosaicJob

COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
COST_PROPERTY = "tilecommit:cost"
#: Which time the item's ``datetime`` is: "acquired" (the source's) or "created" (the item's own).
DATETIME_PROPERTY = "tilecommit:datetime"
#: Why the source's acquisition tag was not the ``datetime``, when it has one that is not a time.
DATETIME_NOTE_PROPERTY = "tilecommit:datetime_note"
#: How the bands' statistics were made: approximate, from which overview level (:mod:`.statistics`).
STATISTICS_PROPERTY = "tilecommit:statistics"
logger = logging.getLogger(__name__)


def native_bbox(scene: SceneInfo) -> list[float]:
    """The scene's extent in its own CRS (``proj:bbox``)."""
    t = scene.affine
    corners = [t * (0, 0), t * (scene.width, 0), t * (scene.width, scene.height), t * (0, scene.height)]
    xs, ys = [c[0] for c in corners], [c[1] for c in corners]
    return [min(xs), min(ys), max(xs), max(ys)]


def mosaic_footprint(mosaic: str | Source, crs: str) -> Footprint:
    """The footprint of the mosaic's valid pixels, from the mask of its smallest overview.

    Reading the mask is a GDAL step like any other: a read that storage did not deliver raises a
    retryable :class:`~tilecommit.errors.StorageFaultError` (the reader's record, whatever GDAL
    returned: :func:`~..reading.source.reading`), so the item is written by the retry
    rather than committed, create-only and for good, without a geometry. Only a footprint that
    cannot be computed from the mask that was read is a missing geometry with a note saying why
    (logged), not a failed job after every tile has been written.
    """
    name = getattr(mosaic, "name", mosaic)
    with gdal_step(f"reading the valid-pixel mask of {name} for its footprint", window="smallest overview"):
        with reading(mosaic) as src:
            levels = len(src.overviews(1))
        open_options = {"overview_level": levels - 1} if levels else {}
        with reading(mosaic, **open_options) as src:
            mask, transform = src.dataset_mask(), src.transform
    try:
        return footprint(as_crs(crs), mask, transform)
    except Exception as exc:  # noqa: BLE001 - documented fallback: geometry null, the reason in the item
        logger.warning("no footprint for %s: %s", name, exc)
        return Footprint(None, None, f"none: the footprint could not be computed ({exc})")


def projection_fields(crs: str) -> dict:
    """``proj:code`` when an EPSG code is equivalent to the CRS, else ``proj:wkt2`` and ``proj:projjson``.

    "Equivalent" as PROJ compares CRSs: a WKT-only CRS GDAL can identify with some confidence,
    but whose definition differs from the code's, keeps its own WKT.
    """
    value = as_crs(crs)
    epsg = value.to_epsg()
    if epsg is not None and same_crs(value, CRS.from_epsg(epsg)):
        return {"code": f"EPSG:{epsg}", "wkt2": None, "projjson": None}
    return {"code": None, "wkt2": value.to_wkt(version="WKT2_2019"), "projjson": value.to_dict(projjson=True)}


def datetime_fields(scene: SceneInfo, created: datetime) -> tuple[datetime, dict]:
    """The item's ``datetime`` and the properties that say which time it is.

    The source's acquisition time when it gives one. Else the creation time: STAC wants a
    ``datetime``, or a null one with ``start_datetime`` and ``end_datetime``, and no interval
    is known either; ``tilecommit:datetime`` then says "created", so no reader takes it for
    the time the pixels were acquired.
    """
    if scene.acquired is not None:
        return datetime.fromisoformat(scene.acquired), {DATETIME_PROPERTY: "acquired"}
    said = {DATETIME_PROPERTY: "created"}
    if scene.acquired_note:
        said[DATETIME_NOTE_PROPERTY] = scene.acquired_note
    return created, said


@dataclass(frozen=True)
class CommittedMosaic:
    """The committed mosaic as its STAC item describes it: its blob name (the item names it and
    its quicklook by relative hrefs), size, sha256 (empty: the storage service assembled it and
    no one hashed its bytes), overview levels, creation time, valid-pixel footprint and its
    bands' statistics (None: an item without them, as builds before them made)."""

    name: str
    nbytes: int
    sha256: str
    overview_levels: int
    created: datetime
    footprint: Footprint
    statistics: MosaicStatistics | None = None


def stac_item_bytes(job: MosaicJob, mosaic: CommittedMosaic) -> bytes:
    """A STAC 1.x item describing the mosaic of ``job``, as canonical JSON bytes (sorted keys).

    ``mosaic.footprint`` (:func:`mosaic_footprint`) gives the geometry and bbox; when it has none
    the item has ``geometry: null`` and no bbox, and ``tilecommit:footprint`` says why.
    ``tilecommit:spec`` is the job's output spec (window size, block size, profile);
    ``tilecommit:profile`` the compression, level and predictor that profile gave this data;
    ``tilecommit:cost`` the job's estimate when the item was made (:mod:`tilecommit.cost`);
    ``tilecommit:datetime`` which time ``datetime`` is (:func:`datetime_fields`).
    """
    scene = job.scene
    moment, said = datetime_fields(scene, mosaic.created)
    item = pystac.Item(
        id=job.job_id,
        geometry=mosaic.footprint.geometry,
        bbox=mosaic.footprint.bbox,
        datetime=moment,
        properties=item_properties(job, mosaic, said),
    )
    ProjectionExtension.ext(item, add_if_missing=True).apply(
        **projection_fields(scene.crs),
        bbox=native_bbox(scene),
        shape=[scene.height, scene.width],
        transform=[float(v) for v in scene.transform[:6]],
    )
    add_mosaic_asset(item, scene, mosaic)
    quicklook_href = "./" + jobs.quicklook_blob_name(job.job_id).rsplit("/", 1)[-1]
    item.add_asset(
        "thumbnail",
        pystac.Asset(
            href=quicklook_href, media_type=pystac.MediaType.PNG, roles=["thumbnail", "overview"], title="Quicklook"
        ),
    )
    return _canonical(item.to_dict(include_self_link=False, transform_hrefs=False))


def item_properties(job: MosaicJob, mosaic: CommittedMosaic, said: dict) -> dict:
    """The item's own properties: when it was made, which time its ``datetime`` is (``said``),
    the job, its spec and what its profile made of this data, its source and cost."""
    spec, scene = job.spec, job.scene
    properties = {
        "created": pystac.utils.datetime_to_str(mosaic.created),
        **said,
        "tilecommit:job_id": job.job_id,
        "tilecommit:overview_levels": mosaic.overview_levels,
        "tilecommit:footprint": mosaic.footprint.note,
        "tilecommit:spec": spec.to_dict(),
        # What the profile made of this data: the codec and the options the tiles were encoded with.
        "tilecommit:profile": {
            "name": spec.profile,
            **{k.lower(): v for k, v in profiles.creation_options(spec.choice, scene.dtype).items()},
        },
    }
    if spec.choice.option("resampling") or spec.block_size != profiles.DEFAULT_BLOCK_SIZE:
        # Named only when the profile's options name them: the items of jobs that do not stay as they were.
        properties["tilecommit:profile"].update(
            overview_resampling=spec.overview_resampling(scene.overview_resampling), blocksize=spec.block_size
        )
    if job.job.blob:
        properties["tilecommit:source"] = job.job.blob
    if job.cost is not None:
        properties[COST_PROPERTY] = job.cost()
    if mosaic.statistics is not None:
        properties[STATISTICS_PROPERTY] = mosaic.statistics.note
    return properties


def add_mosaic_asset(item: pystac.Item, scene: SceneInfo, mosaic: CommittedMosaic) -> None:
    """The item's ``data`` asset: the mosaic, its bands (raster and eo extensions) and its file."""
    asset = pystac.Asset(
        href="./" + mosaic.name.rsplit("/", 1)[-1], media_type=COG_MEDIA_TYPE, roles=["data"], title="Mosaic (COG)"
    )
    # Added first: an asset's extensions are declared on the item that owns it.
    item.add_asset("data", asset)
    # STAC writes a nodata that is no JSON number as its name.
    nodata: float | str | None = scene.nodata
    if scene.nodata is not None and not math.isfinite(scene.nodata):
        nodata = "nan" if math.isnan(scene.nodata) else ("inf" if scene.nodata > 0 else "-inf")
    resolution = abs(scene.transform[0])
    measured = mosaic.statistics.bands if mosaic.statistics is not None else (None,) * scene.count
    RasterExtension.ext(asset, add_if_missing=True).apply(
        bands=[
            RasterBand.create(
                nodata=nodata,  # type: ignore[arg-type]  # pystac writes a name ("nan") as given
                data_type=DataType(scene.dtype),
                spatial_resolution=resolution,
                **meaning,
                **band_statistics_fields(stats),
            )
            for meaning, stats in zip(band_meanings(scene), measured, strict=True)
        ]
    )
    names = eo_bands(scene)
    if names is not None:
        EOExtension.ext(asset, add_if_missing=True).apply(bands=names)
    # A mosaic the storage service assembled has no sha256 (no one reads its bytes): size only.
    FileExtension.ext(asset, add_if_missing=True).apply(
        size=mosaic.nbytes, checksum="1220" + mosaic.sha256 if mosaic.sha256 else None
    )


def band_statistics_fields(stats: BandStatistics | None) -> dict:
    """A band's ``statistics`` and ``histogram`` (rio-stac's fields), where it has them."""
    if stats is None:
        return {}
    fields: dict = {"statistics": Statistics.create(**stats.statistics)}
    if stats.histogram is not None:
        fields["histogram"] = Histogram.create(**stats.histogram)
    return fields


def band_meanings(scene: SceneInfo) -> list[dict]:
    """Per band, the ``raster:bands`` fields that say what a value means (``scale``, ``offset``,
    ``unit``), where the source says it: rio-stac's fields, from the source's own."""
    out = []
    for band in range(scene.count):
        meaning: dict[str, float | str] = {}
        if scene.scales and scene.scales[band] != 1.0:
            meaning["scale"] = scene.scales[band]
        if scene.offsets and scene.offsets[band] != 0.0:
            meaning["offset"] = scene.offsets[band]
        unit = scene.units[band] if scene.units else None
        if unit:
            meaning["unit"] = unit
        out.append(meaning)
    return out


def _eo_common_name(colour: str, description: str | None) -> str | None:
    """The EO common band name (pystac's ``Band.band_range`` knows them) a band's colour
    interpretation (GDAL's red, green, blue) or description (``nir``, ``swir16``...) is, if any."""
    for candidate in (colour.lower(), (description or "").strip().lower()):
        if candidate and EOBand.band_range(candidate) is not None:
            return candidate
    return None


def eo_bands(scene: SceneInfo) -> list[EOBand] | None:
    """``eo:bands`` where the source names its bands (a description, or a colour interpretation
    that is an EO common name), else None: no band list made up of placeholders. A band the
    source does not name is ``b<N>``, as rio-stac calls it."""
    descriptions = scene.descriptions or [None] * scene.count
    colours = scene.colorinterp or [""] * scene.count
    common = [_eo_common_name(c, d) for c, d in zip(colours, descriptions, strict=True)]
    if not any(descriptions) and not any(common):
        return None
    bands = []
    for index, (description, common_name) in enumerate(zip(descriptions, common, strict=True), start=1):
        note = scene.band_notes[index - 1] if index <= len(scene.band_notes) else ""
        name = description or common_name or f"b{index}"
        bands.append(EOBand.create(name=name, common_name=common_name, description=note or None))
    return bands


def _canonical(body: dict) -> bytes:
    return (json.dumps(body, sort_keys=True, indent=2) + "\n").encode("utf-8")


def without_run_facts(body: bytes) -> bytes:
    """The item without what depends on the run that wrote it (``tilecommit:cost``), canonical:
    what a check of an item already stored compares. Bytes that are not an item stay as they are
    (and so differ from any item)."""
    try:
        item = json.loads(body)
        item["properties"].pop(COST_PROPERTY, None)
    except (ValueError, TypeError, KeyError, AttributeError):
        return body
    return _canonical(item)


def without_statistics(body: bytes) -> bytes:
    """The item without its bands' statistics and histograms and the note on them, canonical."""
    item = json.loads(body)
    item["properties"].pop(STATISTICS_PROPERTY, None)
    for asset in item.get("assets", {}).values():
        for band in asset.get("raster:bands", []):
            band.pop("statistics", None)
            band.pop("histogram", None)
    return _canonical(item)


def comparable_items(stored: bytes, made: bytes) -> tuple[bytes, bytes]:
    """What a check of the stored item compares: both without their run facts
    (:func:`without_run_facts`); and when the stored item has no ``tilecommit:statistics``, the
    one made now without its statistics too.

    Builds before the statistics made items without them, and a job they completed may be
    delivered, retried or verified again under this one: its item is still what its mosaic gives,
    and its statistics are absent, not wrong. Everything else in it is still compared. (A job
    id covers the output spec, not the build: putting the statistics in the spec would have
    given every job started after the change a new id, and its upload a second job.)
    """
    found, ours = without_run_facts(stored), without_run_facts(made)
    try:
        before_statistics = STATISTICS_PROPERTY not in json.loads(found)["properties"]
    except (ValueError, TypeError, KeyError):
        return found, ours
    return found, (without_statistics(ours) if before_statistics else ours)


def _stretch(band: np.ma.MaskedArray) -> np.ndarray:
    """8-bit display values: uint8 as is, anything else stretched between its 2nd and 98th percentiles."""
    if band.dtype == np.uint8:
        return np.ma.filled(band, 0).astype(np.uint8)
    valid = band.compressed()
    valid = valid[np.isfinite(valid)] if valid.dtype.kind == "f" else valid
    if valid.size == 0:
        return np.zeros(band.shape, dtype=np.uint8)
    low, high = np.percentile(valid.astype("float64"), [2, 98])
    if high <= low:
        high = low + 1
    scaled = (np.ma.filled(band.astype("float64"), low) - low) * (255.0 / (high - low))
    return np.clip(np.nan_to_num(scaled, nan=0.0), 0, 255).astype(np.uint8)


def quicklook_png(mosaic: str | Source) -> bytes:
    """A PNG of the mosaic's smallest overview: grey (1-2 bands) or RGB (3+), transparent where invalid."""
    with reading(mosaic) as src:
        levels = len(src.overviews(1))
    open_options = {"overview_level": levels - 1} if levels else {}
    with reading(mosaic, **open_options) as src:
        data = src.read(masked=True)
        valid = src.dataset_mask() > 0
    picked = data[:3] if data.shape[0] >= 3 else data[:1]
    planes = [_stretch(b) for b in picked]
    if not valid.all():
        planes.append(np.where(valid, 255, 0).astype(np.uint8))
    stack = np.stack(planes)
    with MemoryFile() as memory, warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a picture, not a map
        with memory.open(
            driver="PNG", width=stack.shape[2], height=stack.shape[1], count=stack.shape[0], dtype="uint8"
        ) as dst:
            dst.write(stack)
        return memory.read()
