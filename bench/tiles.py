"""``python -m bench.tiles``: map tiles of one mosaic, our tile route against titiler, side by side.

One job's mosaic is made through the local host on a private Azurite; then the same tiles are
asked of both servers over HTTP on 127.0.0.1, one request at a time:

- ours: ``GET /api/tiles/jobs/{job}/{z}/{x}/{y}.png`` served by ``devhost`` (the app's route:
  rio-tiler over the mosaic read through the app's pinned reader, :mod:`tilecommit.tiles`);
- titiler: ``titiler.core``'s ``TilerFactory`` (pinned in requirements-titiler.txt, in a venv of
  its own, ``.venv-titiler``: ``make titiler-venv``) under uvicorn, reading the same blob as it
  would in Azure: GDAL's ``/vsiaz/`` with titiler's recommended GDAL settings
  (``GDAL_DISABLE_READDIR_ON_OPEN=EMPTY_DIR``, ``GDAL_HTTP_MERGE_CONSECUTIVE_RANGES=YES``,
  ``VSI_CACHE=TRUE``), never a local copy.

Both read storage through one counting proxy in front of Azurite's blob service, so "bytes read"
is what each server fetched from storage for a tile (every response body, the item and headers'
GETs included). Zoom levels from the mosaic's coarsest overview (its TileJSON ``minzoom``) to
full resolution (``maxzoom``), ``--tiles`` tiles of each; cold: each tile's first request in a
server that has read nothing yet (its first request opens the mosaic), warm: the same tiles
again (rendered again: no ``If-None-Match``). The same options for both: bands 1,2,3,
``rescale=0,65535``. Each pair of tiles is also compared pixel for pixel.

Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
from morecantile import tms as tile_matrix_sets
from rasterio.io import MemoryFile

from testkit.storage_proxy import RecordingProxy

from .common import ROOT, BenchStorage, environment, load1, say, table

TITILER_VENV = ROOT / ".venv-titiler"
TITILER_APP = """
from fastapi import FastAPI
from titiler.core.errors import DEFAULT_STATUS_CODES, add_exception_handlers
from titiler.core.factory import TilerFactory

app = FastAPI()
app.include_router(TilerFactory().router, prefix="/cog")
add_exception_handlers(app, DEFAULT_STATUS_CODES)
"""
#: titiler's documented GDAL settings for COGs in object storage, and GDAL's cache.
TITILER_GDAL = {
    "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
    "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
    "GDAL_HTTP_MULTIPLEX": "YES",
    "GDAL_HTTP_VERSION": "2",
    "VSI_CACHE": "TRUE",
    "VSI_CACHE_SIZE": str(64 * 1024 * 1024),
    "CPL_VSIL_CURL_ALLOWED_EXTENSIONS": ".tif",
}
RESCALE = "0,65535"
WEB_MERCATOR = tile_matrix_sets.get("WebMercatorQuad")


class CountingProxy(RecordingProxy):
    """The blob service's front: counts the bytes of every response body it carries."""

    def __init__(self, target: str):
        super().__init__(target)
        self.bytes = 0
        self.gets = 0

    def send_upstream(self, request, body):
        status, reason, headers, payload = super().send_upstream(request, body)
        with self._lock:
            self.bytes += len(payload)
            self.gets += request.command == "GET"
        return status, reason, headers, payload

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.bytes, self.gets


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blob_proxied(connection_string: str, proxy_port: int, blob_port: int) -> str:
    return connection_string.replace(f"127.0.0.1:{blob_port}/", f"127.0.0.1:{proxy_port}/")


def start_titiler(connection_string: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    python = TITILER_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `make titiler-venv` first")
    (workdir / "titiler_app.py").write_text(TITILER_APP)
    port = _free_port()
    env = {**os.environ, **TITILER_GDAL, "AZURE_STORAGE_CONNECTION_STRING": connection_string}
    process = subprocess.Popen(
        [
            str(python),
            "-m",
            "uvicorn",
            "titiler_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=workdir,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/docs", timeout=2).read()
            return process, base
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise SystemExit("titiler did not start") from None
            time.sleep(0.2)


def fetch(url: str) -> tuple[float, int, bytes]:
    """Seconds to the whole answer, its status and its body (a fresh connection, as a browser's first)."""
    parts = urllib.parse.urlsplit(url)
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    connection.request("GET", f"{parts.path}?{parts.query}" if parts.query else parts.path)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return time.perf_counter() - started, response.status, body


def sample_tiles(bounds: list[float], minzoom: int, maxzoom: int, per_zoom: int) -> list:
    """Up to ``per_zoom`` tiles inside ``bounds`` at each zoom, spread over the mosaic."""
    chosen = []
    for z in range(minzoom, maxzoom + 1):
        tiles = list(WEB_MERCATOR.tiles(*bounds, zooms=[z]))
        step = max(1, len(tiles) // per_zoom)
        chosen += tiles[::step][:per_zoom]
    return chosen


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def run_pass(name: str, url_of, tiles: list, proxy: CountingProxy, bodies: dict, phase: str) -> list[dict]:
    rows = []
    for tile in tiles:
        before = proxy.snapshot()
        sent = len(proxy.sent)
        seconds, status, body = fetch(url_of(tile))
        after = proxy.snapshot()
        if os.environ.get("BENCH_TILES_TRACE"):
            for method, path, headers in proxy.sent[sent:]:
                say(
                    f"  {name} {phase} {tile}: {method} {path[:90]} {headers.get('x-ms-range') or headers.get('range')}"
                )
        if status != 200:
            say(f"{name} {tile} answered {status}: {body[:200]!r}")
        bodies[(name, phase, tile)] = body if status == 200 else None
        rows.append(
            {
                "server": name,
                "phase": phase,
                "z": tile.z,
                "s": seconds,
                "bytes": after[0] - before[0],
                "gets": after[1] - before[1],
                "png": len(body),
            }
        )
    return rows


def pixels(png: bytes | None):
    if png is None:
        return None
    with MemoryFile(png) as memory, memory.open() as src:
        return src.read()


def summary(rows: list[dict]) -> list[list]:
    out = []
    for phase in ("cold", "warm"):
        for z in sorted({r["z"] for r in rows}):
            line: list = [phase, z]
            for server in ("ours", "titiler"):
                picked = [r for r in rows if (r["server"], r["phase"], r["z"]) == (server, phase, z)]
                times = [r["s"] * 1000 for r in picked]
                line += [
                    f"{statistics.median(times):.1f}",
                    f"{percentile(times, 99):.1f}",
                    f"{statistics.mean(r['bytes'] for r in picked) / 1024:.1f}",
                    f"{statistics.mean(r['gets'] for r in picked):.1f}",
                ]
            ours = [r["png"] for r in rows if (r["server"], r["phase"], r["z"]) == ("ours", phase, z)]
            line.append(f"{statistics.mean(ours) / 1024:.1f}")
            out.append(line)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="scene width and height in pixels (uint16, 3 bands)")
    parser.add_argument("--tiles", type=int, default=8, help="tiles per zoom level")
    args = parser.parse_args(argv)

    from devhost.durable.host import HostOptions, LocalHost
    from devhost.session import process_file
    from testkit.scenes import SceneSpec, write_scene
    from tilecommit import settings as names

    with BenchStorage(in_memory=False) as storage, tempfile.TemporaryDirectory(prefix="bench-tiles-") as tmp:
        work = Path(tmp)
        proxy = CountingProxy(f"http://127.0.0.1:{storage.blob_port}").start()
        connection = blob_proxied(storage.connection_string, proxy.port, storage.blob_port)
        say(f"scene {args.size} x {args.size}, 3 bands uint16")
        scene = Path(write_scene(str(work / "scene.tif"), SceneSpec(args.size, args.size, blocksize=512)))
        env = {
            names.STORAGE_CONNECTION: connection,
            names.SETTING_INPUT_CONTAINER: "in-tiles",
            names.SETTING_TILES_CONTAINER: "tiles-tiles",
            names.SETTING_OUTPUT_CONTAINER: "out-tiles",
            names.SETTING_MANIFEST_TABLE: "manifesttiles",
        }
        with environment(env), LocalHost(HostOptions(hub="BenchTiles", http_port=0, watch_interval=0.1)) as host:
            job = process_file(host, scene, timeout=1800)
            if job["status"] != "completed":
                raise SystemExit(f"the job did not complete: {job}")
            job_id = job["job_id"]
            ours = f"{host.http.base_url}/api/tiles/jobs/{job_id}"
            _, _, body = fetch(f"{ours}/tilejson.json")
            import json

            tilejson = json.loads(body)
            tiles = sample_tiles(tilejson["bounds"], tilejson["minzoom"], tilejson["maxzoom"], args.tiles)
            say(f"{len(tiles)} tiles, zoom {tilejson['minzoom']} to {tilejson['maxzoom']}")
            titiler, titiler_base = start_titiler(connection, work)
            try:
                blob = f"/vsiaz/{env[names.SETTING_OUTPUT_CONTAINER]}/mosaics/{job_id}/mosaic.tif"
                urls = {
                    "ours": lambda t: f"{ours}/{t.z}/{t.x}/{t.y}.png?rescale={RESCALE}",
                    "titiler": lambda t: (
                        f"{titiler_base}/cog/tiles/WebMercatorQuad/{t.z}/{t.x}/{t.y}.png"
                        f"?url={urllib.parse.quote(blob)}&bidx=1&bidx=2&bidx=3&rescale={RESCALE}"
                    ),
                }
                rows: list[dict] = []
                bodies: dict = {}
                load_before = load1()
                for phase in ("cold", "warm"):
                    for name in ("ours", "titiler"):
                        rows += run_pass(name, urls[name], tiles, proxy, bodies, phase)
                load_after = load1()
            finally:
                titiler.terminate()
                titiler.wait(timeout=30)
        proxy.stop()

    same = sum(
        1
        for t in tiles
        if (a := pixels(bodies[("ours", "cold", t)])) is not None
        and (b := pixels(bodies[("titiler", "cold", t)])) is not None
        and np.array_equal(a, b)
    )
    headers = (
        ["phase", "z"]
        + [f"{s} {m}" for s in ("ours", "titiler") for m in ("p50 ms", "p99 ms", "KiB read", "GETs")]
        + ["ours PNG KiB"]
    )
    print(table(summary(rows), headers))
    for phase in ("cold", "warm"):
        for server in ("ours", "titiler"):
            times = [r["s"] * 1000 for r in rows if (r["server"], r["phase"]) == (server, phase)]
            print(
                f"{phase} {server}: p50 {statistics.median(times):.1f} ms, p99 {percentile(times, 99):.1f} ms over {len(times)} tiles"
            )
    print(f"tiles with identical pixels (ours vs titiler, cold): {same}/{len(tiles)}")
    print(
        f"load average (1 min) {load_before} -> {load_after}; {threading.active_count()} threads; python {sys.version.split()[0]}"
    )


if __name__ == "__main__":
    main()
