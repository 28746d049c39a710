"""A tile's PNG and a TileJSON, made with rio-tiler from mosaics opened by :mod:`.mosaics`.

A job's tile is rio-tiler's ``Reader.tile`` of the job's committed mosaic (WebMercatorQuad, 256
pixels, nearest resampling: rio-tiler's defaults), stretched to 8 bits by :mod:`.stretch` and
rendered as PNG with the mask as its alpha (nodata, the internal mask and an alpha band are
transparent). A collection's tile is rio-tiler's ``mosaic_reader`` over the mosaics its index
lists where the tile lies, oldest first with the first valid pixel kept (``FirstMethod``):
what titiler's MosaicJSON endpoint draws from one of its pages (docs/catalog.md).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from functools import partial

import rio_tiler
from azure.storage.blob import ContainerClient
from morecantile import Tile as GridTile
from rasterio.crs import CRS
from rio_tiler.constants import WEB_MERCATOR_TMS
from rio_tiler.errors import EmptyMosaicError, TileOutsideBounds
from rio_tiler.io import Reader
from rio_tiler.models import ImageData
from rio_tiler.mosaic import mosaic_reader

from .. import jobs
from ..catalog import documents
from ..errors import JobApiError
from ..settings import Settings
from ..storage_answers import unless_missing
from .mosaics import RECHECK_S, OpenMosaic, OpenMosaics
from .prefetch import TilePrefetcher
from .query import MAX_OVERZOOM, TILE_SIZE, TileQuery, checked_bands, etag_matches, outside_bounds, tile_etag
from .stretch import band_ranges

#: What a tile's bytes depend on besides the mosaic and the request: the renderer and our rules.
RENDERER = f"rio-tiler {rio_tiler.__version__}; tilecommit tiles 1"
WGS84 = CRS.from_epsg(4326)
TILEJSON_VERSION = "3.0.0"


@dataclass(frozen=True)
class Tile:
    """A tile's answer: its strong ETag and its PNG, or no body when the caller holds it (304)."""

    etag: str
    png: bytes | None


def _reader(mosaic: OpenMosaic) -> Reader:
    """rio-tiler's reader over the open dataset (kept with the mosaic: it computes its zooms once)."""
    if "reader" not in mosaic.extra:
        mosaic.extra["reader"] = Reader(None, dataset=mosaic.dataset, tms=WEB_MERCATOR_TMS)
    return mosaic.extra["reader"]


def check_zoom(z: int, maxzoom: int) -> None:
    if z > maxzoom + MAX_OVERZOOM:
        raise JobApiError(
            404,
            "zoom-past-resolution",
            f"zoom {z} is past the mosaic's resolution (zoom {maxzoom}) by more than {MAX_OVERZOOM} levels",
        )


def _prefetcher(mosaic: OpenMosaic) -> TilePrefetcher:
    """What fetches a tile's blocks ahead (kept with the mosaic: it learns the level of each zoom)."""
    if "prefetcher" not in mosaic.extra:
        mosaic.extra["prefetcher"] = TilePrefetcher(mosaic.source, mosaic.dataset.crs, mosaic.dataset.transform)
    return mosaic.extra["prefetcher"]


def image_of(mosaic: OpenMosaic, z: int, x: int, y: int, query: TileQuery) -> ImageData:
    """The tile of ``mosaic`` as 8-bit bands and a mask; raises rio-tiler's ``TileOutsideBounds``."""
    reader = _reader(mosaic)
    bands = checked_bands(query, mosaic.dataset.count)
    left, bottom, right, top = WEB_MERCATOR_TMS.xy_bounds(GridTile(x, y, z))
    with _prefetcher(mosaic).tile(z, (left, bottom, right, top), WEB_MERCATOR_TMS.rasterio_crs):
        image = reader.tile(x, y, z, indexes=bands, tilesize=TILE_SIZE)
    ranges = band_ranges(mosaic.item, bands, mosaic.dataset.dtypes[0], query.rescale)
    if ranges is not None:
        image.rescale(in_range=ranges)
    return image


def png_of(image: ImageData) -> bytes:
    return image.render(img_format="PNG", add_mask=True)


class TileMaker:
    """The tiles and TileJSONs of the mosaics in one output container."""

    def __init__(self, output: ContainerClient, settings: Settings):
        self.mosaics = OpenMosaics(output, settings)
        self.output = output
        self._indexes: dict[str, tuple[float, str, dict, list[dict]]] = {}
        self._lock = threading.Lock()

    # -- a job's mosaic --------------------------------------------------------------------
    def job_tile(self, job_id: str, z: int, x: int, y: int, query: TileQuery, if_none_match: str | None) -> Tile | None:
        """The tile of job ``job_id``'s mosaic (None: the job has no committed mosaic and item)."""

        def work(mosaic: OpenMosaic) -> Tile:
            check_zoom(z, _reader(mosaic).maxzoom)
            etag = tile_etag(mosaic.etag, z, x, y, query, RENDERER)
            if etag_matches(if_none_match, etag):
                return Tile(etag, None)
            try:
                return Tile(etag, png_of(image_of(mosaic, z, x, y, query)))
            except TileOutsideBounds:
                raise outside_bounds(z, x, y) from None

        return self.mosaics.use(jobs.mosaic_blob_name(job_id), jobs.stac_blob_name(job_id), work)

    def job_tilejson(self, job_id: str, tiles_url: str) -> dict | None:
        def work(mosaic: OpenMosaic) -> dict:
            reader = _reader(mosaic)
            bounds = list(reader.get_geographic_bounds(WGS84))
            return tilejson(f"job {job_id}", tiles_url, bounds, reader.minzoom, reader.maxzoom)

        return self.mosaics.use(jobs.mosaic_blob_name(job_id), jobs.stac_blob_name(job_id), work)

    # -- a collection's mosaics ------------------------------------------------------------
    def collection_index(self, collection: str) -> tuple[str, dict, list[dict]] | None:
        """The collection document's ETag, the document and its index entries, oldest first (None:
        no such collection). Kept for :data:`RECHECK_S`: a collection grows as jobs finish."""
        with self._lock:
            kept = self._indexes.get(collection)
        if kept is not None and time.monotonic() - kept[0] < RECHECK_S:
            return kept[1], kept[2], kept[3]
        name = documents.collection_blob_name(collection)
        got = unless_missing("reading", name, lambda: self._download(name))
        if got is None:
            return None
        body, etag = got
        doc = json.loads(body)
        entries: list[dict] = []
        for page in sorted((doc.get(documents.PAGE_RECORDS) or {}).keys()):
            page_name = documents.page_blob_name(collection, page)
            page_got = unless_missing("reading", page_name, partial(self._download, page_name))
            if page_got is not None:
                entries += (json.loads(page_got[0]).get(documents.ITEMS) or {}).values()
        entries.sort(key=lambda e: (e.get("datetime") or "", e["id"]))
        with self._lock:
            self._indexes[collection] = (time.monotonic(), etag, doc, entries)
        return etag, doc, entries

    def _download(self, name: str) -> tuple[bytes, str]:
        download = self.output.download_blob(name, max_concurrency=1)
        return download.readall(), download.properties.etag

    def collection_tile(
        self, collection: str, z: int, x: int, y: int, query: TileQuery, if_none_match: str | None
    ) -> Tile | None:
        """The tile of the collection's mosaics (None: no such collection)."""
        index = self.collection_index(collection)
        if index is None:
            return None
        doc_etag, _, entries = index
        west, south, east, north = WEB_MERCATOR_TMS.bounds(GridTile(x, y, z))
        touching = [e for e in entries if e.get("bbox") and _overlaps(e["bbox"], (west, south, east, north))]
        if not touching:
            raise outside_bounds(z, x, y)
        check_zoom(z, max(e["maxzoom"] for e in touching))
        opened = [(e, self.mosaics.get(e["mosaic"], e["item"])) for e in touching]
        versions = [m.etag for _, m in opened if m is not None]
        etag = tile_etag(doc_etag + "/" + "/".join(versions), z, x, y, query, RENDERER)
        if etag_matches(if_none_match, etag):
            return Tile(etag, None)

        def read(entry: dict, tx: int, ty: int, tz: int) -> ImageData:
            got = self.mosaics.use(entry["mosaic"], entry["item"], lambda m: image_of(m, tz, tx, ty, query))
            if got is None:  # listed, but its mosaic is not stored: nothing of it to draw
                raise TileOutsideBounds(f"{entry['mosaic']} is not stored")
            return got

        try:
            image, _ = mosaic_reader([e for e, m in opened if m is not None], read, x, y, z, threads=0)
        except (EmptyMosaicError, TileOutsideBounds):  # every listed mosaic was outside the tile
            raise outside_bounds(z, x, y) from None
        return Tile(etag, png_of(image))

    def collection_tilejson(self, collection: str, tiles_url: str) -> dict | None:
        index = self.collection_index(collection)
        if index is None:
            return None
        _, doc, entries = index
        bounds = doc.get(documents.BBOX) or list(documents.WORLD)
        minzoom = min((e["minzoom"] for e in entries), default=0)
        maxzoom = max((e["maxzoom"] for e in entries), default=0)
        return tilejson(f"collection {collection}", tiles_url, bounds, minzoom, maxzoom)

    def close(self) -> None:
        self.mosaics.close()


def _overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def tilejson(name: str, tiles_url: str, bounds: list[float], minzoom: int, maxzoom: int) -> dict:
    """A TileJSON 3.0.0 document of one tile URL template (``{z}/{x}/{y}``)."""
    center = [(bounds[0] + bounds[2]) / 2, (bounds[1] + bounds[3]) / 2, minzoom]
    return {
        "tilejson": TILEJSON_VERSION,
        "name": name,
        "version": "1.0.0",
        "scheme": "xyz",
        "tiles": [tiles_url],
        "minzoom": minzoom,
        "maxzoom": maxzoom,
        "bounds": bounds,
        "center": center,
    }
