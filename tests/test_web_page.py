"""The web page's files as the app serves them (GET /api/ui/{*path}): through the app's own
route on the local host's router, with the page the build made (web/dist, `make setup`), and on
a folder of the test's own for what a build never makes (a link out of the folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from client_functions import web_page
from devhost.durable.functions import FunctionIndex
from devhost.durable.http_routes import HttpRoutes

KEY = "test-function-key"


@pytest.fixture(scope="module")
def routes():
    if not (web_page.WEB_ROOT / web_page.INDEX).is_file():
        pytest.fail(f"{web_page.WEB_ROOT} has no page: `make setup` builds it (web/build.mjs)")
    served = HttpRoutes(FunctionIndex.load(), lambda: "{}", function_key=KEY, port=0)
    yield served
    served.server.server_close()


def get(routes: HttpRoutes, path: str, **headers: str) -> tuple[int, dict, bytes]:
    return routes.handle("GET", path, headers, b"")


def bundle(suffix: str) -> str:
    (name,) = [p.name for p in web_page.WEB_ROOT.iterdir() if p.suffix == suffix]
    return name


def test_the_page_and_its_bundle_are_served_with_their_types_and_caching(routes):
    status, headers, body = get(routes, "/api/ui/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Cache-Control"] == "no-cache" and "default-src 'self'" in headers["Content-Security-Policy"]
    script, style = bundle(".js"), bundle(".css")
    assert f'src="{script}"' in body.decode() and f'href="{style}"' in body.decode()
    for name, kind in ((script, "text/javascript; charset=utf-8"), (style, "text/css; charset=utf-8")):
        status, headers, body = get(routes, f"/api/ui/{name}")
        assert status == 200 and headers["Content-Type"] == kind and body == (web_page.WEB_ROOT / name).read_bytes()
        assert headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert headers["X-Content-Type-Options"] == "nosniff"
        again, _, empty = get(routes, f"/api/ui/{name}", **{"If-None-Match": headers["ETag"]})
        assert again == 304 and empty == b""
    assert get(routes, "/api/ui/index.html")[2] == get(routes, "/api/ui/")[2]


def test_the_folder_url_without_its_slash_is_redirected_to_it(routes):
    status, headers, _ = get(routes, "/api/ui")
    assert status == 308 and headers["Location"] == "/api/ui/"


@pytest.mark.parametrize(
    "path",
    [
        "/api/ui/../function_app.py",
        "/api/ui/%2e%2e/function_app.py",
        "/api/ui/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/api/ui/..%5c..%5cfunction_app.py",
        "/api/ui/%2fetc%2fpasswd",
        "/api/ui//etc/passwd",
        "/api/ui/./index.html",
        "/api/ui/.hidden.js",
        "/api/ui/index.html%00.js",
        "/api/ui/missing.js",
        "/api/ui/build.mjs",
        "/api/ui/../src/app.js",
    ],
)
def test_no_path_reaches_a_file_outside_the_page_or_one_the_build_did_not_make(routes, path):
    status, headers, body = get(routes, path)
    assert status == 404 and body == b"not found\n", (path, status)


def test_a_link_out_of_the_folder_is_not_followed(tmp_path: Path):
    root = tmp_path / "dist"
    root.mkdir()
    (root / "index.html").write_text("<p>page</p>")
    secret = tmp_path / "secret.json"
    secret.write_text('{"key": "x"}')
    (root / "leak.json").symlink_to(secret)
    assert web_page.serve("leak.json", root=root).status == 404
    assert web_page.serve("", root=root).body == b"<p>page</p>"
    assert web_page.serve("index.html", root=root).status == 200


def test_the_page_needs_no_key_and_the_data_it_reads_does(routes):
    assert get(routes, "/api/ui/")[0] == 200
    for path in ("/api/jobs", "/api/jobs/0123456789abcdef/windows", "/api/collections/tilecommit"):
        assert get(routes, path)[0] == 401, path


def test_each_rendered_window_records_when_its_activity_started_and_finished(rendered, stores):
    from datetime import UTC, datetime

    from tilecommit.manifest import count_manifest, window_timings

    from .raster_jobs import JOB, render_all

    _, path, scene, settings, results = rendered
    times = window_timings(stores["manifest"], JOB)
    assert set(times) == set(count_manifest(stores["manifest"], JOB).entries) == {r.window for r in results}
    for started, finished in times.values():
        assert started is not None and finished is not None and started < finished <= datetime.now(UTC)
    # A repeat finds each window's row already there: the first attempt's times stay.
    assert all(r.skipped for r in render_all(path, scene, settings, stores))
    assert window_timings(stores["manifest"], JOB) == times
