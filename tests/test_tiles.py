"""Map tiles of a job's mosaic and of its collection, over real HTTP on 127.0.0.1 through the local
host, on Azurite held to Azure's rules: pixels equal rio-tiler's rendering of the source at the same
tiles, strong ETags with 304, and every bad input a 4xx with a JSON error body."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from rasterio.io import MemoryFile
from rio_cogeo.cogeo import cog_translate
from rio_cogeo.profiles import cog_profiles
from rio_tiler.io import Reader
from rio_tiler.mosaic import mosaic_reader

from devhost.session import process_file
from testkit.scenes import SceneSpec, write_scene
from tilecommit.catalog import collections, documents
from tilecommit.errors import JobApiError
from tilecommit.jobs import job_id_for
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.tiles.mosaics import KeptMosaicBlob
from tilecommit.tiles.query import MAX_OVERZOOM, TileQuery, etag_matches, parse_query, tile_etag
from tilecommit.tiles.render import TileMaker
from tilecommit.tiles.stretch import band_ranges, histogram_percentiles

from .app_jobs import download, local_host, make_scene

pytestmark = pytest.mark.slow

KEY = "test-tiles-key"


def get(host, path: str, headers: dict | None = None, *, key: str | None = KEY) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(f"{host.http.base_url}{path}")
    for name, value in {**({"x-functions-key": key} if key else {}), **(headers or {})}.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def refusal(host, path: str) -> tuple[int, str, str]:
    status, headers, body = get(host, path)
    assert headers["Content-Type"].startswith("application/json"), (path, status, body)
    error = json.loads(body)["error"]
    return status, error["code"], error["message"]


def pixels(png: bytes) -> np.ndarray:
    with MemoryFile(png) as memory, memory.open() as src:
        assert src.driver == "PNG"
        return src.read()


def rio_tiler_png(path, z: int, x: int, y: int, bands=(1, 2, 3), rescale=None) -> bytes:
    """rio-tiler's own rendering of ``path`` at a tile, with the options the route was given."""
    with Reader(str(path)) as src:
        image = src.tile(x, y, z, indexes=bands, tilesize=256)
    if rescale is not None:
        image.rescale(in_range=[rescale] * len(bands))
    return image.render(img_format="PNG", add_mask=True)


def test_tiles_of_a_job_and_its_collection(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1024, 512)
    with local_host(app_env, http_port=0, function_key=KEY) as host:
        summary = process_file(host, scene, timeout=120)
        assert summary["status"] == "completed", summary
        job_id = summary["job_id"]
        base = f"/api/tiles/jobs/{job_id}"

        status, headers, body = get(host, f"{base}/tilejson.json?bands=3,2,1&code=secret")
        assert status == 200 and headers["Content-Type"] == "application/json"
        tilejson = json.loads(body)
        assert tilejson["tilejson"] == "3.0.0" and "secret" not in body.decode()
        assert tilejson["tiles"] == [f"{host.http.base_url}{base}/{{z}}/{{x}}/{{y}}.png?bands=3,2,1"]
        maxzoom, (west, south, east, north) = tilejson["maxzoom"], tilejson["bounds"]
        with Reader(str(scene)) as src:
            assert maxzoom == src.maxzoom and tilejson["minzoom"] == src.minzoom
            inside = src.tms.tile((west + east) / 2, (south + north) / 2, maxzoom)
            corner = src.tms.tile(west + 1e-9, north - 1e-9, maxzoom)
            finer = src.tms.tile(west + (east - west) / 3, north - (north - south) / 3, maxzoom + 1)

        # Three tiles equal rio-tiler's rendering of the source: exactly (tolerance 0).
        rescale = (0, 65535)
        for tile in (inside, corner, finer):
            status, headers, png = get(host, f"{base}/{tile.z}/{tile.x}/{tile.y}.png?rescale=0,65535")
            assert status == 200 and headers["Content-Type"] == "image/png", (tile, png[:200])
            expected = rio_tiler_png(scene, tile.z, tile.x, tile.y, rescale=rescale)
            assert np.array_equal(pixels(png), pixels(expected)), tile
        # The corner tile lies partly outside the mosaic: transparent there, opaque inside.
        alpha = pixels(get(host, f"{base}/{corner.z}/{corner.x}/{corner.y}.png?rescale=0,65535")[2])[-1]
        assert set(np.unique(alpha)) == {0, 255}

        # The default stretch: the item's histogram, 2nd to 98th percentile, per band.
        item = json.loads(download(storage, app_env.output, f"mosaics/{job_id}/item.json"))
        ranges = band_ranges(item, (1, 2, 3), "uint16", None)
        assert ranges is not None and all(0 < low < high < 65535 for low, high in ranges)
        status, _, png = get(host, f"{base}/{inside.z}/{inside.x}/{inside.y}.png")
        with Reader(str(scene)) as src:
            expected_image = src.tile(inside.x, inside.y, inside.z, indexes=(1, 2, 3))
        expected_image.rescale(in_range=ranges)
        assert status == 200 and np.array_equal(pixels(png), pixels(expected_image.render(img_format="PNG")))

        # A coarse tile reads the mosaic's own overviews: rio-tiler's rendering of the mosaic.
        mosaic = tmp_path / "mosaic.tif"
        mosaic.write_bytes(download(storage, app_env.output, f"mosaics/{job_id}/mosaic.tif"))
        coarse = Reader(str(mosaic)).tms.tile((west + east) / 2, (south + north) / 2, maxzoom - 3)
        status, _, png = get(host, f"{base}/{coarse.z}/{coarse.x}/{coarse.y}.png?rescale=0,65535")
        expected = rio_tiler_png(mosaic, coarse.z, coarse.x, coarse.y, rescale=rescale)
        assert status == 200 and np.array_equal(pixels(png), pixels(expected))

        # Strong ETag, immutable caching, 304 on If-None-Match; other parameters, another ETag.
        path = f"{base}/{inside.z}/{inside.x}/{inside.y}.png"
        status, headers, _ = get(host, path)
        etag = headers["ETag"]
        assert etag.startswith('"') and not etag.startswith("W/")
        assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
        status, again, body = get(host, path, {"If-None-Match": etag})
        assert (status, body, again["ETag"]) == (304, b"", etag)
        assert get(host, path, {"If-None-Match": '"other"'})[0] == 200
        assert get(host, f"{path}?bands=3,2,1")[1]["ETag"] != etag

        # The collection the job joined: one item, so its tile is the job's.
        collection = summary["collection"]["collection"]
        cbase = f"/api/tiles/collections/{collection}"
        status, _, body = get(host, f"{cbase}/tilejson.json")
        assert status == 200 and json.loads(body)["maxzoom"] >= maxzoom
        tile_path = f"{inside.z}/{inside.x}/{inside.y}.png?rescale=0,65535"
        status, headers, png = get(host, f"{cbase}/{tile_path}")
        assert status == 200 and np.array_equal(pixels(png), pixels(get(host, f"{base}/{tile_path}")[2]))
        assert get(host, f"{cbase}/{tile_path}", {"If-None-Match": headers["ETag"]})[0] == 304

        # Bad input: each a clear 4xx with a JSON error, never a 500.
        far = f"{maxzoom}/0/0.png"
        for path, expected_status, code in (
            ("/api/tiles/jobs/0000000000000000/tilejson.json", 404, "job-not-found"),
            ("/api/tiles/jobs/0000000000000000/1/0/0.png", 404, "job-not-found"),
            ("/api/tiles/jobs/not-a-job/1/0/0.png", 400, "invalid-job-id"),
            (f"{base}/{far}", 404, "tile-outside-bounds"),
            (f"{base}/3/8/0.png", 404, "tile-outside-bounds"),
            (f"{base}/{maxzoom + MAX_OVERZOOM + 1}/0/0.png", 404, "zoom-past-resolution"),
            (f"{base}/a/0/0.png", 422, "invalid-tile"),
            (f"{base}/25/0/0.png", 422, "invalid-tile"),
            (f"{base}/{inside.z}/{inside.x}/{inside.y}.png?bands=1,2", 422, "invalid-bands"),
            (f"{base}/{inside.z}/{inside.x}/{inside.y}.png?bands=4", 400, "invalid-bands"),
            (f"{base}/{inside.z}/{inside.x}/{inside.y}.png?rescale=9", 422, "invalid-rescale"),
            (f"{base}/{inside.z}/{inside.x}/{inside.y}.png?rescale=5,1", 422, "invalid-rescale"),
            ("/api/tiles/collections/Not.An.Id/1/0/0.png", 400, "invalid-collection-id"),
            ("/api/tiles/collections/nothing-here/tilejson.json", 404, "collection-not-found"),
            (f"{cbase}/{far}", 404, "tile-outside-bounds"),
        ):
            status, found, message = refusal(host, path)
            assert (status, found) == (expected_status, code), (path, message)
        assert refusal(host, f"{base}/{far}")[2] == f"Tile {maxzoom}/0/0 is outside bounds"  # titiler's words
        assert get(host, f"{base}/{far}", key=None)[0] == 401  # auth level FUNCTION


def test_a_job_still_running_is_409_and_a_failed_one_has_no_mosaic(storage, app_env, tmp_path):
    scene = make_scene(tmp_path / "scene.tif", 1024, 1024)
    bad = tmp_path / "bad.tif"
    bad.write_bytes(b"not a raster at all")
    with local_host(app_env, http_port=0, function_key=KEY) as host:
        blob = host.blobs.get_blob_client(app_env.input, scene.name)
        with scene.open("rb") as data:
            etag = blob.upload_blob(data, overwrite=True)["etag"]
        spec, _ = OutputSpec.started_for(host.settings, scene.name, None)
        job_id = job_id_for(blob.url, etag, spec)
        deadline = time.monotonic() + 60
        while (host.engine.status(job_id) or {}).get("status") != "Running":
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.02)
        status, code, message = refusal(host, f"/api/tiles/jobs/{job_id}/14/0/0.png")
        assert (status, code) == (409, "job-not-finished") and "running" in message
        # Stopped here: a job still running leaves its mosaic uncommitted, which is all this shows.
        cancel = urllib.request.Request(
            f"{host.http.base_url}/api/jobs/{job_id}/cancel", method="POST", data=b"", headers={"x-functions-key": KEY}
        )
        assert urllib.request.urlopen(cancel, timeout=60).status == 202

        failed = process_file(host, bad, timeout=60)
        assert failed["status"] == "failed" and failed["job_id"]
        status, code, _ = refusal(host, f"/api/tiles/jobs/{failed['job_id']}/tilejson.json")
        assert (status, code) == (404, "no-mosaic")


def test_the_stretch_and_the_etag_rules():
    """The histogram's percentiles against numpy's on the values it counts; the ETag's inputs."""
    values = np.arange(1000, dtype="float64")
    counts, edges = np.histogram(values, bins=10)
    histogram = {"count": 11, "min": float(edges[0]), "max": float(edges[-1]), "buckets": counts.tolist()}
    low, high = histogram_percentiles(histogram, 2, 98)
    assert abs(low - np.percentile(values, 2)) < 1 and abs(high - np.percentile(values, 98)) < 1
    item = {
        "assets": {
            "data": {"raster:bands": [{"histogram": histogram}, {"statistics": {"minimum": 3, "maximum": 9}}, {}]}
        }
    }
    assert band_ranges(item, (2,), "uint16", None) == [(3.0, 9.0)]
    assert band_ranges(item, (3,), "uint16", None) == [(0.0, 65535.0)]  # no statistics: the dtype's range
    assert band_ranges(item, (1, 2), "uint8", None) is None  # 8-bit: as it is
    assert band_ranges(item, (1,), "float32", (1.0, 2.0)) == [(1.0, 2.0)]
    with pytest.raises(JobApiError) as refused:
        band_ranges(item, (3,), "float32", None)
    assert refused.value.status == 422
    query = parse_query({"bands": "3,2,1", "rescale": "0,1000"})
    assert query == TileQuery((3, 2, 1), (0.0, 1000.0))
    one = tile_etag('"0x8D"', 14, 1, 2, query, "r")
    assert one == tile_etag("0x8D", 14, 1, 2, query, "r")
    assert len({one, tile_etag("0x8E", 14, 1, 2, query, "r"), tile_etag("0x8D", 14, 1, 3, query, "r")}) == 3
    assert etag_matches(f'W/{one}, "x"', one) and etag_matches("*", one) and not etag_matches('"x"', one)


def _cog(path, seed: int) -> bytes:
    """A 1024 x 1024 3-band uint16 COG with overviews, its pixels from ``seed``."""
    source = write_scene(str(path.with_suffix(".src.tif")), SceneSpec(1024, 1024, seed=seed, blocksize=256))
    cog_translate(source, str(path), cog_profiles.get("deflate"), quiet=True)
    return path.read_bytes()


def test_a_mosaic_replaced_while_open_is_read_again_at_its_new_version(output, tmp_path):
    """A repair writes a new version of the mosaic: the next read of the old one is refused (412),
    the mosaic is opened again at the new version, and its tiles carry the new version's ETag."""
    job_id = "0123456789abcdef"
    mosaic, item = f"mosaics/{job_id}/mosaic.tif", f"mosaics/{job_id}/item.json"
    first, second = _cog(tmp_path / "first.tif", 1), _cog(tmp_path / "second.tif", 2)
    output.upload_blob(mosaic, first)
    output.upload_blob(item, b"{}")
    maker = TileMaker(output, Settings())
    query = TileQuery(rescale=(0, 65535))
    try:
        with Reader(str(tmp_path / "first.tif")) as src:
            fine = list(src.tms.tiles(*src.get_geographic_bounds(src.tms.rasterio_geographic_crs), zooms=[src.maxzoom]))
            coarse = src.tms.tile(*src.tms.ul(fine[0])[:2], src.minzoom)
        before = maker.job_tile(job_id, fine[0].z, fine[0].x, fine[0].y, query, None)
        assert before is not None and before.png is not None
        output.upload_blob(mosaic, second, overwrite=True)
        # Blocks this tile needs were never read: the read at the old ETag is refused, the mosaic
        # opened again, and the tile is the new version's.
        after = maker.job_tile(job_id, coarse.z, coarse.x, coarse.y, query, None)
        expected = rio_tiler_png(tmp_path / "second.tif", coarse.z, coarse.x, coarse.y, rescale=(0, 65535))
        assert after is not None and np.array_equal(pixels(after.png), pixels(expected))
        again = maker.job_tile(job_id, fine[0].z, fine[0].x, fine[0].y, query, None)
        assert again is not None and again.etag != before.etag
        expected = rio_tiler_png(tmp_path / "second.tif", fine[0].z, fine[0].x, fine[0].y, rescale=(0, 65535))
        assert np.array_equal(pixels(again.png), pixels(expected))
        assert not np.array_equal(pixels(again.png), pixels(before.png))
    finally:
        maker.close()


def test_a_tiles_blocks_are_fetched_ahead_once_its_zoom_showed_which_level_gdal_reads(output, tmp_path, monkeypatch):
    """The first tile of a zoom is read as GDAL asks, a block a GET; later tiles of that zoom find
    their blocks fetched ahead (merged, at once, on the prefetch's threads), so GDAL's own reads
    fetch nothing. Every tile's pixels are rio-tiler's rendering of the file."""
    source = write_scene(str(tmp_path / "src.tif"), SceneSpec(2048, 2048, seed=3, blocksize=256))
    cog = tmp_path / "cog.tif"
    cog_translate(source, str(cog), {**cog_profiles.get("deflate"), "blockxsize": 256, "blockysize": 256}, quiet=True)
    job_id = "fedcba9876543210"
    output.upload_blob(f"mosaics/{job_id}/mosaic.tif", cog.read_bytes())
    output.upload_blob(f"mosaics/{job_id}/item.json", b"{}")
    fetches: list[str] = []
    plain_fetch = KeptMosaicBlob.fetch

    def counted(self, offset, length):
        fetches.append("ahead" if threading.current_thread().name.startswith("tileprefetch") else "asked")
        return plain_fetch(self, offset, length)

    monkeypatch.setattr(KeptMosaicBlob, "fetch", counted)
    maker = TileMaker(output, Settings())
    query = TileQuery(rescale=(0, 65535))
    with Reader(str(cog)) as src:
        zoom = src.maxzoom
        tiles = list(src.tms.tiles(*src.get_geographic_bounds(src.tms.rasterio_geographic_crs), zooms=[zoom]))
    assert len(tiles) >= 4
    try:
        maker.job_tile(job_id, tiles[0].z, tiles[0].x, tiles[0].y, query, None)  # opens the mosaic
        per_tile = []
        for tile in tiles[1:5]:
            fetches.clear()
            made = maker.job_tile(job_id, tile.z, tile.x, tile.y, query, None)
            expected = rio_tiler_png(cog, tile.z, tile.x, tile.y, rescale=(0, 65535))
            assert made is not None and np.array_equal(pixels(made.png), pixels(expected))
            per_tile.append((fetches.count("asked"), fetches.count("ahead")))
    finally:
        maker.close()
    # Tiles 2 to 5 of the zoom: nothing asked by GDAL reaches storage; what they need came ahead
    # (a block already kept by a neighbour is not fetched again).
    assert all(asked == 0 for asked, _ in per_tile), per_tile
    assert sum(ahead for _, ahead in per_tile) > 0, per_tile


def test_a_collections_tile_is_its_mosaics_oldest_first(output, tmp_path):
    """Two overlapping mosaics listed by the catalog's own write protocol: the collection's tile is
    rio-tiler's mosaic of them in the index's order (oldest first, the first valid pixel kept),
    each stretched by its item (no statistics in these items: the uint16 range)."""
    scenes = {
        "aaaaaaaaaaaaaaaa": ((500000.0, 4600000.0), 1, "2024-01-01T00:00:00Z"),
        "bbbbbbbbbbbbbbbb": ((505120.0, 4598000.0), 2, "2024-06-01T00:00:00Z"),
    }
    paths = {}
    for job_id, (origin, seed, moment) in scenes.items():
        path = tmp_path / f"{job_id}.tif"
        source = write_scene(
            str(tmp_path / f"{job_id}.src.tif"), SceneSpec(1024, 1024, origin=origin, seed=seed, blocksize=256)
        )
        cog_translate(source, str(path), cog_profiles.get("deflate"), quiet=True)
        paths[job_id] = path
        mosaic, item_blob = f"mosaics/{job_id}/mosaic.tif", f"mosaics/{job_id}/item.json"
        output.upload_blob(mosaic, path.read_bytes())
        output.upload_blob(item_blob, b"{}")
        with Reader(str(path)) as src:
            bbox = list(src.get_geographic_bounds(src.tms.rasterio_geographic_crs))
        item = {"id": job_id, "bbox": bbox, "properties": {"datetime": moment, "proj:shape": [1024, 1024]}}
        entry = documents.entry(item, item_blob=item_blob, mosaic_blob=mosaic, item_sha256="0" * 64)
        collections.add_item(output, "pair", entry, job_id=job_id)

    maker = TileMaker(output, Settings())
    try:
        with Reader(str(paths["aaaaaaaaaaaaaaaa"])) as first:
            west, south, east, north = first.get_geographic_bounds(first.tms.rasterio_geographic_crs)
            tile = first.tms.tile(east, south + (north - south) / 4, first.maxzoom)  # A's edge, inside B

        def read(path, x, y, z):
            with Reader(str(path)) as src:
                image = src.tile(x, y, z, indexes=(1, 2, 3))
            image.rescale(in_range=[(0, 65535)] * 3)
            return image

        order = [paths["aaaaaaaaaaaaaaaa"], paths["bbbbbbbbbbbbbbbb"]]
        expected, used = mosaic_reader(order, read, tile.x, tile.y, tile.z, threads=0)
        assert len(used) == 2  # the tile shows both
        got = maker.collection_tile("pair", tile.z, tile.x, tile.y, TileQuery(), None)
        assert got is not None and np.array_equal(pixels(got.png), pixels(expected.render(img_format="PNG")))
        reversed_order, _ = mosaic_reader(order[::-1], read, tile.x, tile.y, tile.z, threads=0)
        assert not np.array_equal(pixels(got.png), pixels(reversed_order.render(img_format="PNG")))
        doc = maker.collection_tilejson("pair", "http://x/{z}/{x}/{y}.png")
        assert doc is not None and doc["bounds"][0] == pytest.approx(west) and doc["bounds"][2] > east
    finally:
        maker.close()
