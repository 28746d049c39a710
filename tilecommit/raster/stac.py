"""The mosaic's companions: a STAC item (projection, raster and file extensions) and a PNG quicklook.

Both are pure functions of the committed mosaic (its pixels, size, checksum and creation time),
so a retry that regenerates them produces the same bytes and its create-only commit agrees.
"""

from __future__ import annotations

import json
import math
import warnings
from datetime import datetime

import numpy as np
import pystac
import rasterio
from pystac.extensions.file import FileExtension
from pystac.extensions.projection import ProjectionExtension
from pystac.extensions.raster import DataType, RasterBand, RasterExtension
from rasterio.errors import NotGeoreferencedWarning
from rasterio.io import MemoryFile
from rasterio.warp import transform_geom

from .scene import SceneInfo

COG_MEDIA_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
#: Points per edge when the footprint is reprojected to WGS 84, so curved edges stay close.
FOOTPRINT_POINTS_PER_EDGE = 16


def _footprint(scene: SceneInfo) -> tuple[dict, list[float], list[float]]:
    """(GeoJSON polygon in EPSG:4326, its bbox, the bbox in the scene's CRS)."""
    t = scene.affine
    corners = [t @ (0, 0), t @ (scene.width, 0), t @ (scene.width, scene.height), t @ (0, scene.height)]
    xs, ys = [c[0] for c in corners], [c[1] for c in corners]
    native_bbox = [min(xs), min(ys), max(xs), max(ys)]
    ring = []
    for (x0, y0), (x1, y1) in zip(corners, corners[1:] + corners[:1], strict=True):
        for i in range(FOOTPRINT_POINTS_PER_EDGE):
            f = i / FOOTPRINT_POINTS_PER_EDGE
            ring.append((x0 + (x1 - x0) * f, y0 + (y1 - y0) * f))
    ring.append(ring[0])
    polygon = {"type": "Polygon", "coordinates": [ring]}
    geometry = transform_geom(scene.crs, "EPSG:4326", polygon, precision=9)
    coords = [pt for r in geometry["coordinates"] for pt in r]
    bbox = [min(p[0] for p in coords), min(p[1] for p in coords), max(p[0] for p in coords), max(p[1] for p in coords)]
    return geometry, bbox, native_bbox


def stac_item_bytes(
    *,
    job_id: str,
    scene: SceneInfo,
    mosaic_href: str,
    quicklook_href: str,
    mosaic_nbytes: int,
    mosaic_sha256: str,
    overview_levels: int,
    created: datetime,
    source_name: str = "",
) -> bytes:
    """A STAC 1.x item describing the mosaic, as canonical JSON bytes (sorted keys)."""
    geometry, bbox, native_bbox = _footprint(scene)
    properties = {
        "created": pystac.utils.datetime_to_str(created),
        "tilecommit:job_id": job_id,
        "tilecommit:overview_levels": overview_levels,
    }
    if source_name:
        properties["tilecommit:source"] = source_name
    item = pystac.Item(id=job_id, geometry=geometry, bbox=bbox, datetime=created, properties=properties)

    projection = ProjectionExtension.ext(item, add_if_missing=True)
    crs = rasterio.crs.CRS.from_user_input(scene.crs)
    epsg = crs.to_epsg()
    projection.apply(
        code=f"EPSG:{epsg}" if epsg else None,
        wkt2=None if epsg else crs.to_wkt(),
        bbox=native_bbox,
        shape=[scene.height, scene.width],
        transform=[float(v) for v in scene.transform[:6]],
    )

    mosaic = pystac.Asset(href=mosaic_href, media_type=COG_MEDIA_TYPE, roles=["data"], title="Mosaic (COG)")
    item.add_asset("data", mosaic)
    nodata = scene.nodata
    if nodata is not None and not math.isfinite(nodata):
        nodata = "nan" if math.isnan(nodata) else ("inf" if nodata > 0 else "-inf")
    resolution = abs(scene.transform[0])
    RasterExtension.ext(mosaic, add_if_missing=True).apply(
        bands=[
            RasterBand.create(nodata=nodata, data_type=DataType(scene.dtype), spatial_resolution=resolution)
            for _ in range(scene.count)
        ]
    )
    FileExtension.ext(mosaic, add_if_missing=True).apply(size=mosaic_nbytes, checksum="1220" + mosaic_sha256)
    item.add_asset(
        "thumbnail",
        pystac.Asset(href=quicklook_href, media_type=pystac.MediaType.PNG, roles=["thumbnail", "overview"], title="Quicklook"),
    )
    body = item.to_dict(include_self_link=False, transform_hrefs=False)
    return (json.dumps(body, sort_keys=True, indent=2) + "\n").encode("utf-8")


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


def quicklook_png(mosaic_path: str) -> bytes:
    """A PNG of the mosaic's smallest overview: grey (1-2 bands) or RGB (3+), transparent where invalid."""
    with rasterio.open(mosaic_path) as src:
        levels = len(src.overviews(1))
    open_options = {"overview_level": levels - 1} if levels else {}
    with rasterio.open(mosaic_path, **open_options) as src:
        data = src.read(masked=True)
        valid = src.dataset_mask() > 0
    picked = data[:3] if data.shape[0] >= 3 else data[:1]
    planes = [_stretch(b) for b in picked]
    if not valid.all():
        planes.append(np.where(valid, 255, 0).astype(np.uint8))
    stack = np.stack(planes)
    with MemoryFile() as memory, warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)  # a picture, not a map
        with memory.open(driver="PNG", width=stack.shape[2], height=stack.shape[1], count=stack.shape[0], dtype="uint8") as dst:
            dst.write(stack)
        return memory.read()
