"""Helpers for the raster tests: run a job's steps directly on a scene, read what they stored."""

from __future__ import annotations

from tilecommit.grid import plan_windows
from tilecommit.raster import SceneInfo, assemble_mosaic, render_tile
from tilecommit.settings import Settings

JOB = "0123456789abcdef"


def render_all(path, scene: SceneInfo, settings: Settings, stores, job_id: str = JOB, gdal_options=None):
    return [
        render_tile(
            path,
            window,
            job_id=job_id,
            tiles=stores["tiles"],
            manifest=stores["manifest"],
            settings=settings,
            gdal_options=gdal_options,
        )
        for window in plan_windows(scene.width, scene.height, settings.window_size)
    ]


def assemble(scene, settings, stores, storage, job_id: str = JOB, **kwargs):
    return assemble_mosaic(
        job_id,
        scene,
        tiles=stores["tiles"],
        output=stores["output"],
        manifest=stores["manifest"],
        claims=stores["claims"],
        settings=settings,
        gdal_options=storage.gdal_options(),
        **kwargs,
    )


def download(container, name: str, path) -> str:
    with open(path, "wb") as f:
        container.download_blob(name).readinto(f)
    return str(path)


def blob_names(container) -> list[str]:
    return sorted(b.name for b in container.list_blobs())


def manifest_rows(table, job_id: str = JOB) -> list[dict]:
    return list(table.query_entities("PartitionKey eq @job", parameters={"job": job_id}))
