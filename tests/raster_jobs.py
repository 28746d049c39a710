"""Helpers for the raster tests: run a job's steps directly on a scene, read what they stored."""

from __future__ import annotations

import itertools

import numpy as np
import rasterio

from tilecommit.grid import plan_windows
from tilecommit.jobs import Job
from tilecommit.raster import SceneInfo, assemble_mosaic, render_tile
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec
from tilecommit.stores import JobStores

JOB = "0123456789abcdef"


def job_of(settings: Settings, job_id: str = JOB, source_name: str = "", spec: OutputSpec | None = None) -> Job:
    """The job the library is given, made to ``spec`` (default: the settings' spec); only its id,
    its spec and its blob name (the source the STAC item names) reach the outputs."""
    spec = spec or OutputSpec.from_settings(settings)
    return Job(job_id, source_name, url="", etag="", size=0, spec=spec, batch_size=settings.batch_size)


def job_stores(stores: dict, settings: Settings, gdal_options: dict | None = None) -> JobStores:
    """The test's containers and table (the ``stores`` fixture, or clients of the same) as a job's stores."""
    return JobStores(stores["tiles"], stores["output"], stores["manifest"], settings, gdal_options)


def render_all(path, scene: SceneInfo, settings: Settings, stores, job_id: str = JOB, gdal_options=None):
    job, job_stores_ = job_of(settings, job_id), job_stores(stores, settings, gdal_options)
    return [
        render_tile(job, job_stores_, path, window)
        for window in plan_windows(scene.width, scene.height, settings.window_size)
    ]


def run_steps(source: str, settings: Settings, stores, storage, **assembly):
    """A job's steps on ``source`` as its activities run them: inspect, render every window,
    assemble (``assembly``: :func:`assemble`'s keywords). Returns the spec, the scene and the result."""
    from tilecommit.raster import inspect_source

    spec = OutputSpec.from_settings(settings)
    scene = inspect_source(source, settings=settings, spec=spec)
    render_all(source, scene, settings, stores)
    return spec, scene, assemble(scene, settings, stores, storage, **assembly)


def assemble(scene, settings, stores, storage, job_id: str = JOB, source_name: str = "", gdal_options=None, **kwargs):
    job = job_of(settings, job_id, source_name)
    return assemble_mosaic(job, job_stores(stores, settings, gdal_options), scene, **kwargs)


def download(container, name: str, path) -> str:
    with open(path, "wb") as f:
        container.download_blob(name).readinto(f)
    return str(path)


def blob_names(container) -> list[str]:
    return sorted(b.name for b in container.list_blobs())


def manifest_rows(table, job_id: str = JOB) -> list[dict]:
    return list(table.query_entities("PartitionKey eq @job", parameters={"job": job_id}))


def overview_sizes(path: str) -> list[tuple[int, int]]:
    with rasterio.open(path) as src:
        sizes = [(src.width, src.height)]
        levels = len(src.overviews(1))
    for level in range(levels):
        with rasterio.open(path, overview_level=level) as ovr:
            sizes.append((ovr.width, ovr.height))
    return sizes


def assert_complete_pyramid(path: str, block: int = 256) -> None:
    """Every level about half the one before; the smallest fits in one block and the one before does not."""
    sizes = overview_sizes(path)
    for (pw, ph), (w, h) in itertools.pairwise(sizes):
        assert pw // 2 <= w <= pw // 2 + 1 and ph // 2 <= h <= ph // 2 + 1, sizes
    assert max(sizes[-1]) <= block, f"smallest level {sizes[-1]} is larger than a block: levels missing ({sizes})"
    if len(sizes) > 1:
        assert max(sizes[-2]) > block, f"a superfluous level: {sizes}"


def assert_same_pixels(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    # NaN == NaN for this purpose: a float nodata of NaN must survive as NaN.
    assert np.array_equal(actual, expected, equal_nan=expected.dtype.kind == "f")


class RequestLog:
    """Every request a client sends (raw_request_hook): method, blob/table path, query and headers, in order."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict, dict]] = []

    def __call__(self, pipeline_request) -> None:
        from urllib.parse import parse_qs, urlsplit

        request = pipeline_request.http_request
        url = urlsplit(request.url)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append((request.method, url.path, query, dict(request.headers)))

    def put_blocks(self, name: str) -> list[tuple[str, str, dict, dict]]:
        return [r for r in self.requests if r[0] == "PUT" and r[1].endswith("/" + name) and r[2].get("comp") == "block"]

    def put_block_lists(self, name: str) -> list[tuple[str, str, dict, dict]]:
        return [
            r for r in self.requests if r[0] == "PUT" and r[1].endswith("/" + name) and r[2].get("comp") == "blocklist"
        ]

    def put_blobs(self, name: str) -> list[tuple[str, str, dict, dict]]:
        return [r for r in self.requests if r[0] == "PUT" and r[1].endswith("/" + name) and "comp" not in r[2]]


def hooked_stores(storage, stores, log: RequestLog) -> dict:
    """The same containers and tables, through clients that record every request into ``log``."""
    blobs = storage.blob_service(raw_request_hook=log)
    tables = storage.table_service(raw_request_hook=log)
    return {
        "tiles": blobs.get_container_client(stores["tiles"].container_name),
        "output": blobs.get_container_client(stores["output"].container_name),
        "manifest": tables.get_table_client(stores["manifest"].table_name),
    }
