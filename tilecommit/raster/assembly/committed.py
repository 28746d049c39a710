"""The committed mosaic: what an assembly knows it must be, and its verification.

Every path that meets a committed mosaic (a fresh commit, a refused one, an attempt stopped
because another committed, a mosaic already there when the assembly starts, a scrub) verifies it
with :func:`verify_mosaic` before it is called done: committed by an assembly (its metadata names
the method, the level count and the evidence), block-copied ones of the planned size and head,
a streamed one's sha256 matched by its bytes, and every check of a fresh mosaic
(:func:`~.checks.verify_committed_mosaic`). :func:`verify_outputs` is the same check with the
companions, writing nothing.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from ... import gates, jobs
from ...errors import IncompatibleTilesError, MosaicCheckError, StorageFaultError
from ...settings import Settings
from ...spec import OutputSpec
from ...usage import ContextExecutor
from ..reading.scene import SceneInfo
from . import attempt
from .block_copy import prepare_block_copy
from .block_sources import FETCH_THREADS
from .checks import blob_properties, check_manifest, check_planned_mosaic, repair_instruction, verify_committed_mosaic
from .copy_plan import plan_copy
from .pyramid import mosaic_overview_levels
from .sidecars import write_sidecars

#: Blob metadata key recording the mosaic's overview level count (read back by a duplicate call).
OVERVIEW_LEVELS_METADATA_KEY = "overview_levels"
#: Blob metadata key of a server-side mosaic's evidence: the sha256 of its plan (head, ranges and
#: the sha256 of the tile each comes from), since no one reads its bytes to hash them.
PLAN_SHA256_METADATA_KEY = "plan_sha256"
#: Blob metadata key naming the path that made the mosaic: one of :data:`COMMITTED_METHODS`.
METHOD_METADATA_KEY = "method"
COMMITTED_METHODS = ("server", "blocks", "vrt")


@dataclass(frozen=True)
class PlannedMosaic:
    """What an assembly knows its mosaic must be, to verify a committed one against.

    ``method`` is the path that planned it; ``evidence`` the metadata (key, value) its commit
    carries: a streamed sha256, or a server-side plan's digest. ``nbytes`` is its planned size
    and ``head`` its planned header and directories (block copy only: a VRT mosaic has no head
    before GDAL has written the whole file).
    """

    method: str
    levels: int
    evidence: tuple[str, str]
    nbytes: int | None = None
    head: bytes | None = None


@dataclass(frozen=True)
class BlockCopy:
    """A block-copy mosaic planned, nothing staged: the layout (its local sources still open), the
    copy plan, the tile versions its ranges are pinned to, and what the mosaic must be."""

    layout: Any
    plan: Any
    versions: dict[str, str | None]
    planned: PlannedMosaic


@contextmanager
def planned_block_copy(
    job_id: str,
    scene: SceneInfo,
    windows,
    summary,
    *,
    tiles: ContainerClient,
    settings: Settings,
    spec: OutputSpec,
    workdir: str,
    timings: dict[str, float],
) -> Iterator[BlockCopy]:
    """The block-copy mosaic these tiles make, planned: tile heads read, coarse levels computed,
    the head checked (:func:`check_planned_mosaic`), the copy ranges planned and pinned to the
    tile versions the manifest rows recorded. The layout stays open inside the block, for a
    stager that reads the coarse levels from it. Raises :class:`IncompatibleTilesError`."""
    with ContextExecutor(max_workers=FETCH_THREADS, thread_name_prefix="tilefetch") as executor:
        layout = prepare_block_copy(
            scene,
            windows,
            summary,
            tiles=tiles,
            settings=settings,
            spec=spec,
            workdir=workdir,
            timings=timings,
            executor=executor,
        )
        try:
            started = time.perf_counter()
            head, order, total = layout.writer.block_order(layout.directories)
            check_planned_mosaic(
                head, scene, layout.levels, settings=settings, job_id=job_id, block_size=spec.block_size
            )
            plan = plan_copy(head, order, total, leaders=layout.writer.leaders, trailers=layout.writer.trailers)
            versions = {w.id: summary.entries[w.id].etag for w in windows}
            timings["check"] = time.perf_counter() - started
            # Named by the tiles' contents, not their versions: a run that renders purged tiles
            # again makes new versions of the same bytes, and must meet the same mosaic.
            contents = {w.id: summary.entries[w.id].sha256 for w in windows}
            evidence = (PLAN_SHA256_METADATA_KEY, plan.digest(contents))
            yield BlockCopy(
                layout, plan, versions, PlannedMosaic("server", layout.levels, evidence, nbytes=total, head=head)
            )
        finally:
            layout.close()


def plan_block_copy(
    job_id: str,
    scene: SceneInfo,
    windows,
    summary,
    *,
    tiles: ContainerClient,
    settings: Settings,
    spec: OutputSpec,
    workdir: str,
    timings: dict[str, float],
) -> PlannedMosaic:
    """What an existing block-copied mosaic of these tiles must be (:func:`planned_block_copy`)."""
    with planned_block_copy(
        job_id, scene, windows, summary, tiles=tiles, settings=settings, spec=spec, workdir=workdir, timings=timings
    ) as copy:
        return copy.planned


def verify_mosaic(
    job_id: str,
    scene: SceneInfo,
    planned: PlannedMosaic | None,
    plan_block_copy: Callable[[], PlannedMosaic],
    *,
    output: ContainerClient,
    settings: Settings,
    spec: OutputSpec,
    gdal_options: dict | None,
    timings: dict[str, float],
):
    """Verify the committed mosaic before it counts as done, whoever committed it; its properties.

    It must be what these tiles make, as far as that is known without building it again:
    committed by an assembly (its metadata names the method, the level count and the evidence);
    a block-copied one (``server``, ``blocks``) of the planned size, beginning with the planned
    header and directories, its evidence ours where the methods agree (``plan_block_copy`` plans
    it when this attempt has no block-copy plan: tile heads and coarse levels, nothing staged);
    a streamed sha256 this attempt cannot know, matched by the stored bytes (one full read); and
    every check of a fresh mosaic (:func:`verify_committed_mosaic`, :func:`check_mosaic_file`).

    A mosaic known bad raises :class:`MosaicCheckError` saying how to repair it (a re-run would
    meet the same mosaic); a check that storage kept from finishing raises a retryable fault.
    """
    name = jobs.mosaic_blob_name(job_id)
    started = time.perf_counter()
    props = blob_properties(output, name)
    if props is None:
        raise StorageFaultError(f"{name} vanished after it was committed")
    method = (props.metadata or {}).get(METHOD_METADATA_KEY, "")
    try:
        if method not in COMMITTED_METHODS:
            raise MosaicCheckError(
                f"committed mosaic {name}: no {METHOD_METADATA_KEY} in its metadata ({props.metadata}): "
                "no assembly committed it"
            )
        if method == "vrt":
            planned = planned if planned is not None and planned.method == "vrt" else None
        elif planned is None or planned.method == "vrt":
            try:
                planned = plan_block_copy()
            except IncompatibleTilesError as exc:
                raise MosaicCheckError(
                    f"committed mosaic {name} says it was block-copied ({method}), but its tiles cannot be: {exc}"
                ) from exc
        levels = (
            planned.levels
            if planned is not None
            else mosaic_overview_levels(scene.width, scene.height, spec.block_size)
        )
        key = PLAN_SHA256_METADATA_KEY if method == "server" else gates.SHA256_METADATA_KEY
        ours = planned.evidence[1] if planned is not None and planned.evidence[0] == key else None
        verify_committed_mosaic(
            output,
            name,
            scene,
            levels,
            settings=settings,
            gdal_options=gdal_options,
            nbytes=planned.nbytes if planned is not None else None,
            metadata={OVERVIEW_LEVELS_METADATA_KEY: str(levels), key: ours},
            head=planned.head if planned is not None else None,
            hash_content_from=key if ours is None and key == gates.SHA256_METADATA_KEY else None,
            block_size=spec.block_size,
        )
    except MosaicCheckError as exc:
        raise MosaicCheckError(f"{exc}; {repair_instruction(job_id)}") from exc
    timings["verify"] = time.perf_counter() - started
    return props


def verifier(
    job_id: str,
    scene: SceneInfo,
    windows,
    summary,
    *,
    tiles: ContainerClient,
    output: ContainerClient,
    settings: Settings,
    spec: OutputSpec,
    gdal_options: dict | None,
    workdir: str,
    timings: dict[str, float],
) -> Callable[[PlannedMosaic | None], Any]:
    """The one verification of the committed mosaic against these tiles (:func:`verify_mosaic`),
    given the plan an attempt has (None: planned on demand from the tiles, nothing staged)."""

    def plan() -> PlannedMosaic:
        return plan_block_copy(
            job_id, scene, windows, summary, tiles=tiles, settings=settings, spec=spec, workdir=workdir, timings=timings
        )

    def verify(planned: PlannedMosaic | None):
        return verify_mosaic(
            job_id,
            scene,
            planned,
            plan,
            output=output,
            settings=settings,
            spec=spec,
            gdal_options=gdal_options,
            timings=timings,
        )

    return verify


def verify_outputs(
    job_id: str,
    scene: SceneInfo,
    *,
    tiles: ContainerClient,
    output: ContainerClient,
    manifest: TableClient,
    settings: Settings,
    spec: OutputSpec,
    gdal_options: dict | None = None,
    source_name: str = "",
) -> None:
    """Verify the committed mosaic and its companions as an assembly does before it calls them
    done (:func:`verify_mosaic`, :func:`write_sidecars`), writing nothing: a scrub's check.

    Raises :class:`MosaicCheckError` for an output that is missing or known bad,
    :class:`IncompleteManifestError` when the tiles themselves are not what their rows say.
    """
    name = jobs.mosaic_blob_name(job_id)
    if blob_properties(output, name) is None:
        raise MosaicCheckError(f"{name} does not exist; {repair_instruction(job_id)}")
    windows, summary = check_manifest(job_id, scene, tiles=tiles, manifest=manifest, spec=spec)
    timings: dict[str, float] = {}
    workdir = attempt.new_workdir(job_id)
    try:
        verifier(
            job_id,
            scene,
            windows,
            summary,
            tiles=tiles,
            output=output,
            settings=settings,
            spec=spec,
            gdal_options=gdal_options,
            workdir=workdir,
            timings=timings,
        )(None)
        write_sidecars(
            job_id,
            scene,
            output=output,
            settings=settings,
            spec=spec,
            source_name=source_name,
            timings=timings,
            verify_only=True,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
