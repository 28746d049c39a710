"""The web page in a real browser: Debian's Chromium, driven by Playwright, against ``devhost
serve`` on Azurite, as a user sees it. A scene uploaded appears in the job list, its progress
moves, it completes; its page shows the mosaic on a map whose tiles the app answered with 200 and
whose pixels equal rio-tiler's rendering of the source at the same tiles; a second job is
cancelled and retried from its page. Each page's screenshot is saved in the test's folder and its
path printed.
"""

from __future__ import annotations

import math
import re
import shutil
import signal
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
import requests
from rasterio.io import MemoryFile

from testkit.scenes import SceneSpec, write_scene
from testkit.storage_proxy import FaultPlan, FaultProxy, Gate
from tilecommit import settings as setting_names
from tilecommit.storage import StorageConnection

from .app_jobs import AppEnv, serve, upload
from .conftest import app_env_for

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
#: Chromium's switches for a test: headless, no GPU, and nothing fetched from anywhere on its own.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: The band combination and stretch the job page is opened with, which its map's tiles ask for.
SHOWN = "bands=3,2,1&rescale=1500,9500"
TILE_URL = re.compile(r"/api/tiles/jobs/(?P<job>[0-9a-f]+)/(?P<z>\d+)/(?P<x>\d+)/(?P<y>\d+)\.png")


@dataclass
class Site:
    app_env: AppEnv
    base: str
    storage: object
    folder: Path
    context: object
    log: Path
    #: Holds the host's tile commits (Put Blob of ``tiles/...``) while closed: a job stopped
    #: part-way for as long as a test looks at it, however fast the machine runs it.
    gate: Gate
    shots: list[Path] = field(default_factory=list)

    def page_url(self, fragment: str = "/") -> str:
        return f"{self.base}/api/ui/#{fragment}"

    def screenshot(self, page, name: str) -> Path:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"screenshot of the {name} page: {path}")
        self.shots.append(path)
        return path

    def job(self, job_id: str) -> dict:
        return requests.get(f"{self.base}/api/jobs/{job_id}", timeout=10).json()


@pytest.fixture(scope="module")
def site(azurite, tmp_path_factory) -> Iterator[Site]:
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is not installed: `make chromium` installs it")
    from playwright.sync_api import sync_playwright

    folder = tmp_path_factory.mktemp("browser")
    with pytest.MonkeyPatch.context() as monkeypatch:
        app_env = app_env_for(azurite, monkeypatch, "tests/test_browser.py")
        tiles = f"/{app_env.tiles}/tiles/"
        gate = Gate(lambda method, path: method == "PUT" and tiles in path and "comp=" not in path)
        blobs = FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", FaultPlan(gate=gate)).start()
        proxied = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{blobs.port}/")
        app_env.env[setting_names.STORAGE_CONNECTION] = proxied
        # The test's uploads go through the proxy too: a job's id covers the upload's URL.
        storage = StorageConnection.from_connection_string(proxied)
        log = folder / "serve.log"
        host = serve(app_env, log)
        try:
            base = re.search(r"the web page on (http://127\.0\.0\.1:\d+)/api/ui/", log.read_text()).group(1)
            with sync_playwright() as playwright:
                context = playwright.chromium.launch_persistent_context(
                    str(folder / "profile"),  # a new, empty user-data-dir
                    executable_path=CHROMIUM,
                    headless=True,
                    args=CHROMIUM_ARGS,
                    viewport={"width": 1280, "height": 900},
                )
                try:
                    yield Site(app_env, base, storage, folder, context, log, gate)
                finally:
                    context.close()
        finally:
            gate.open()
            host.send_signal(signal.SIGINT)
            host.wait(timeout=60)
            blobs.stop()


def row_of(page, job_id: str) -> dict | None:
    """What the job list shows of ``job_id`` now: its state and windows done/total, or None."""
    return page.evaluate(
        """(id) => {
            const row = document.querySelector(`tr[data-job="${id}"]`);
            if (!row) return null;
            return {state: row.dataset.state, count: row.querySelector(".count").textContent,
                    cost: row.cells[6].textContent, elapsed: row.cells[5].textContent};
        }""",
        job_id,
    )


def windows_done(row: dict) -> int:
    """The windows done a row of the job list shows (``8 / 24``), 0 before it shows a count."""
    return int(row["count"].split(" / ")[0]) if " / " in row["count"] else 0


@dataclass
class Watched:
    job_id: str
    scene: Path
    seen: list[dict]


@pytest.fixture(scope="module")
def completed(site: Site) -> Watched:
    """A scene uploaded while the job list is open, the list read every 100 ms until it completes.

    24 windows in 6 batches of 4: the gate lets 20 tiles' commits through and holds the last 4,
    so at least 2 batches finish while the job cannot; it opens once the list has shown them."""
    scene = Path(write_scene(str(site.folder / "watched.tif"), SceneSpec(1536, 1024, 3, "uint16", nodata=0)))
    page = site.context.new_page()
    page.goto(site.page_url("/"))
    page.wait_for_selector("table.jobs")
    site.gate.close(after=20)
    try:
        job_id = upload(site.storage, site.app_env, scene)
        seen: list[dict] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            row = row_of(page, job_id)
            if row and (not seen or row != seen[-1]):
                seen.append(row)
                if windows_done(row) >= 8 and row["state"] == "running":
                    site.screenshot(page, "jobs-running")
                    site.gate.open()
            if row and row["state"] in ("completed", "failed", "terminated"):
                break
            time.sleep(0.1)
    finally:
        site.gate.open()
    site.screenshot(page, "jobs")
    page.close()
    return Watched(job_id, scene, seen)


def test_an_upload_appears_in_the_list_its_progress_moves_and_it_completes(completed: Watched):
    seen = completed.seen
    assert seen, "the job never appeared in the list"
    assert seen[-1]["state"] == "completed", seen
    done = [tuple(map(int, row["count"].split(" / "))) for row in seen if " / " in row["count"]]
    assert done[-1] == (24, 24), seen  # 1536 x 1024 in 256 px windows
    # The list was not reloaded: the same page showed the job while it ran, then its end.
    assert any(row["state"] in ("pending", "running") for row in seen), seen
    assert any(row["state"] == "running" and 8 <= windows_done(row) < 24 for row in seen), seen
    assert len({d for d, _ in done}) >= 2, f"the windows done never moved: {seen}"
    assert [d for d, _ in done] == sorted(d for d, _ in done), seen
    assert seen[-1]["cost"].startswith("$") and seen[-1]["elapsed"], seen


@dataclass(frozen=True)
class Answered:
    """A tile request the browser made and the app's answer to it, which the browser was given."""

    url: str
    status: int
    body: bytes


def pass_on(route) -> Answered:
    """The request sent on to the app as it is, and the app's answer handed to the browser as it is."""
    response = route.fetch()
    body = response.body()
    route.fulfill(response=response, body=body)
    return Answered(route.request.url, response.status, body)


def tile_pixels(png: bytes) -> np.ndarray:
    with MemoryFile(png) as memory, memory.open() as src:
        return src.read()


def rio_tiler_tile(scene: Path, z: int, x: int, y: int, query: dict[str, list[str]]) -> np.ndarray:
    """rio-tiler's own rendering of the source at the tile, with the band and stretch the app's
    tile URL asked for."""
    from rio_tiler.errors import NoOverviewWarning
    from rio_tiler.io import Reader

    bands = tuple(int(b) for b in query["bands"][0].split(","))
    low, high = (float(v) for v in query["rescale"][0].split(","))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoOverviewWarning)  # the source is made without overviews
        with Reader(str(scene)) as src:
            image = src.tile(x, y, z, indexes=bands)
    image.rescale(in_range=[(low, high)] * len(bands))
    return tile_pixels(image.render(img_format="PNG"))


def mercator(lon: float, lat: float) -> tuple[float, float]:
    half = 20037508.342789244
    return lon * half / 180, math.log(math.tan((90 + lat) * math.pi / 360)) * half / math.pi


def test_the_job_page_shows_the_map_whose_tiles_equal_rio_tilers_rendering(site: Site, completed: Watched):
    assert completed.seen[-1]["state"] == "completed"
    page = site.context.new_page()
    tiles: list[Answered] = []
    page.route(lambda url: TILE_URL.search(url) is not None, lambda route: tiles.append(pass_on(route)))
    with page.expect_response(lambda r: "/tilejson.json" in r.url) as answered:
        page.goto(site.page_url(f"/jobs/{completed.job_id}?{SHOWN}"))
    tilejson = answered.value.json()
    page.wait_for_selector("#map canvas")
    page.wait_for_selector("#quicklook")
    item = page.inner_text("#stac-item")
    assert f'"id": "{completed.job_id}"' in item or completed.job_id in item
    page.wait_for_selector(".timeline .lane .run")
    assert page.locator(".timeline .lane").count() == 24
    windows = requests.get(f"{site.base}/api/jobs/{completed.job_id}/windows", timeout=10).json()["windows"]
    assert len(windows) == 24 and all(w["batch"].startswith(f"{completed.job_id}-batch-") for w in windows)
    assert all(w["run_s"] > 0 and w["queue_s"] is not None and w["queue_s"] >= 0 for w in windows), windows
    assert page.locator(".timeline .lane .wait").count() == 24
    page.evaluate(DRAWN)
    site.screenshot(page, "job")

    # Full resolution, where the mosaic's pixels are the source's own.
    west, south, east, north = tilejson["bounds"]
    centre = mercator((west + east) / 2, (south + north) / 2)
    zoom = tilejson["maxzoom"]
    show_at(page, centre, zoom)
    site.screenshot(page, "job-full-resolution")
    fetched = [r for r in tiles if int(TILE_URL.search(r.url)["z"]) == zoom]
    assert fetched and all(r.status == 200 for r in fetched), [(r.url, r.status) for r in fetched]
    assert len(fetched) >= 3, [r.url for r in fetched]
    assert all(parse_qs(urlsplit(r.url).query) == parse_qs(SHOWN) for r in fetched), fetched[0].url
    for response in fetched[:3]:
        where = TILE_URL.search(response.url)
        z, x, y = (int(where[k]) for k in ("z", "x", "y"))
        expected = rio_tiler_tile(completed.scene, z, x, y, parse_qs(urlsplit(response.url).query))
        np.testing.assert_array_equal(tile_pixels(response.body), expected, err_msg=response.url)
        if response is fetched[0]:
            drawn = canvas_at_tile(page, z, x, y)
            shown = expected[:, : drawn.shape[1], : drawn.shape[2]]
            opaque = shown[3] == 255  # the canvas keeps no colour under a transparent pixel
            assert opaque.sum() > 10_000 and (drawn[3][~opaque] == 0).all(), response.url
            np.testing.assert_array_equal(drawn[:, opaque], shown[:, opaque], err_msg=f"canvas at {response.url}")

    # Verify, from the page: confirmed, started, and its report shown once the scrub ends.
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator('button[data-action="verify"]').click()
    page.wait_for_selector('#action-note:text("24 windows checked, 0 differing")', timeout=60_000)
    site.screenshot(page, "job-verified")
    page.unroute_all(behavior="wait")
    page.close()


#: Draw the map again and wait until every tile in view is drawn.
DRAWN = """async () => {
    const map = window.tilecommitMap;
    const drawn = new Promise((done) => map.once("rendercomplete", done));
    map.render();
    await drawn;
}"""
#: Centre the map on a point at a zoom and wait until every tile in view is drawn.
SHOW_AT = """async ([centre, zoom]) => {
    const map = window.tilecommitMap;
    const drawn = new Promise((done) => map.once("rendercomplete", done));
    map.getView().setCenter(centre);
    map.getView().setZoom(zoom);
    map.render();
    await drawn;
}"""


def show_at(page, centre: list[float] | tuple[float, float], zoom: int) -> None:
    page.evaluate(SHOW_AT, [list(centre), zoom])


def canvas_at_tile(page, z: int, x: int, y: int) -> np.ndarray:
    """The map's canvas pixels (RGBA, bands first) from tile z/x/y's top-left corner, once the map
    is centred on that corner at zoom z (each tile pixel one canvas pixel) with the footprint hidden."""
    half = 20037508.342789244
    corner = [-half + x * 2 * half / 2**z, half - y * 2 * half / 2**z]
    page.evaluate("() => window.tilecommitMap.getLayers().item(1).setVisible(false)")
    show_at(page, corner, z)
    pixels = page.evaluate(
        """([corner, z]) => {
            const map = window.tilecommitMap;
            const canvas = map.getViewport().querySelector("canvas");
            const [cx, cy] = map.getPixelFromCoordinate(corner).map(Math.round);
            const ratio = canvas.width / map.getSize()[0];
            const w = Math.min(256, canvas.width - cx * ratio), h = Math.min(256, canvas.height - cy * ratio);
            const data = canvas.getContext("2d").getImageData(cx * ratio, cy * ratio, w, h).data;
            return {w, h, ratio, data: Array.from(data)};
        }""",
        [corner, z],
    )
    assert pixels["ratio"] == 1, pixels["ratio"]
    return np.array(pixels["data"], dtype=np.uint8).reshape(pixels["h"], pixels["w"], 4).transpose(2, 0, 1)


def test_a_running_job_is_cancelled_and_retried_from_its_page(site: Site):
    scene = Path(write_scene(str(site.folder / "cancelled.tif"), SceneSpec(2048, 2048, 3, "uint16")))
    site.gate.close()  # no tile is committed until the job is cancelled: it cannot end first
    try:
        job_id = upload(site.storage, site.app_env, scene)
        page = site.context.new_page()
        asked: list[str] = []

        def accept(dialog) -> None:
            asked.append(dialog.message)
            dialog.accept()

        page.on("dialog", accept)
        page.goto(site.page_url(f"/jobs/{job_id}"))
        site.gate.wait_for_held()
        page.locator('button[data-action="cancel"]').click(timeout=30_000)
        page.wait_for_selector('#job-state:text("terminated")', timeout=30_000)
    finally:
        site.gate.open()
    assert asked and asked[0].startswith("Cancel this job?")
    assert site.job(job_id)["state"] == "terminated"
    site.screenshot(page, "job-cancelled")

    page.locator('button[data-action="retry"]').click(timeout=10_000)
    page.wait_for_selector('#job-state:text("completed")', timeout=90_000)
    assert asked[-1].startswith("Run this job again?")
    assert site.job(job_id)["progress"]["windows_done"] == 64
    site.screenshot(page, "job-retried")
    page.close()


COLLECTION_TILE_URL = re.compile(r"/api/tiles/collections/(?P<collection>[a-z0-9_-]+)/(\d+)/(\d+)/(\d+)\.png")


def test_the_collection_page_shows_its_document_and_its_mosaic(site: Site, completed: Watched):
    collection = site.job(completed.job_id)["summary"]["collection"]["collection"]
    page = site.context.new_page()
    tiles: list[Answered] = []
    page.route(lambda url: COLLECTION_TILE_URL.search(url) is not None, lambda route: tiles.append(pass_on(route)))
    page.goto(site.page_url(f"/collections/{collection}"))
    page.wait_for_selector("#map canvas")
    page.evaluate(DRAWN)
    heads, values = page.locator("table.facts th").all_inner_texts(), page.locator("table.facts td").all_inner_texts()
    facts = dict(zip(heads, values, strict=True))
    assert int(facts["items"]) >= 1, facts
    assert tiles and all(r.status == 200 for r in tiles), [(r.url, r.status) for r in tiles]
    site.screenshot(page, "collection")
    page.unroute_all(behavior="wait")
    page.close()


def test_with_a_function_key_the_page_asks_for_it_and_sends_it_in_a_header_never_a_url(site: Site, azurite):
    key = "browser-test-key"
    with pytest.MonkeyPatch.context() as monkeypatch:
        app_env = app_env_for(azurite, monkeypatch, "tests/test_browser.py::keyed")
        log = site.folder / "serve-keyed.log"
        host = serve(app_env, log, "--function-key", key)
    try:
        base = re.search(r"the web page on (http://127\.0\.0\.1:\d+)/api/ui/", log.read_text()).group(1)
        page = site.context.new_page()
        sent: list = []
        page.on("request", lambda request: sent.append(request))
        page.goto(f"{base}/api/ui/#/")
        page.wait_for_selector("#key-form:not([hidden])")
        assert "could not list the jobs" in page.inner_text("main")
        page.fill("#key-input", key)
        page.click("#key-form button")
        page.wait_for_selector("p.status:text('0 jobs')")
        site.screenshot(page, "jobs-keyed")
        assert all(key not in request.url for request in sent), [r.url for r in sent]
        api = [r for r in sent if "/api/jobs" in r.url]
        assert api[0].headers.get("x-functions-key") is None and api[-1].headers["x-functions-key"] == key
        page.close()
    finally:
        host.send_signal(signal.SIGINT)
        host.wait(timeout=60)


def test_what_the_page_reads_beside_the_job_api_and_its_refusals(site: Site, completed: Watched):
    api, job_id = f"{site.base}/api", completed.job_id
    item = requests.get(f"{api}/jobs/{job_id}/outputs/item.json", timeout=10)
    stored = site.storage.blob_service().get_blob_client(site.app_env.output, f"mosaics/{job_id}/item.json")
    assert item.status_code == 200 and item.content == stored.download_blob().readall()
    assert item.headers["ETag"] == stored.get_blob_properties().etag
    assert item.headers["Cache-Control"] == "private, max-age=31536000, immutable"
    quicklook = requests.get(f"{api}/jobs/{job_id}/outputs/quicklook.png", timeout=10)
    assert quicklook.headers["Content-Type"] == "image/png" and quicklook.content.startswith(b"\x89PNG")
    collection = site.job(job_id)["summary"]["collection"]["collection"]
    document = requests.get(f"{api}/collections/{collection}", timeout=10)
    assert document.json()["type"] == "Collection" and document.headers["Cache-Control"] == "no-cache"
    refusals = {
        f"jobs/{job_id}/outputs/mosaic.tif": (404, "unknown-output"),
        f"jobs/{job_id}/outputs/..%2F..%2Fcollections%2F{collection}%2Fcollection.json": (404, "unknown-output"),
        "jobs/0123456789abcdef/outputs/item.json": (404, "job-not-found"),
        "jobs/0123456789abcdef/windows": (404, "job-not-found"),
        "jobs/not-a-job/windows": (400, "invalid-job-id"),
        "collections/Not_An_Id": (400, "invalid-collection-id"),
        "collections/no-such-collection": (404, "not-found"),
    }
    for path, (status, code) in refusals.items():
        answer = requests.get(f"{api}/{path}", timeout=10)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), path
