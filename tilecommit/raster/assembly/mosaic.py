"""Assemble a job's tiles into one COG mosaic, committed once, with its STAC item and quicklook.

A job walks through assembly in a straight line:

1. what is there: a mosaic already committed is not built again but verified
   (:func:`.commit.already_present`); a rebuild whose inspected version changed is ``superseded``;
2. the plan: the manifest holds every planned window (:func:`.manifest_check.check_manifest`;
   each tile is then read and copied at its row's ETag, so one rewritten or deleted since is
   refused where it is read); the attempt gets a temporary directory of its own
   (:mod:`.attempt`: no claim, each attempt stages under block ids of its own);
3. a strategy builds the mosaic and commits nothing (:mod:`.strategy`): ``server`` by default,
   ``auto`` falling back to ``blocks`` or ``vrt`` when the service or the tiles cannot
   (:data:`FALLBACKS`, each fallback logged with its reason);
4. the one shared step commits it create-only and verifies what holds the name
   (:func:`.commit.commit_and_verify`), companions included;
5. the result, a :class:`.commit.MosaicResult`.

An attempt that meets the mosaic committed by another while it stages stops and verifies that
mosaic instead. All three strategies are exact at full resolution; one known bad mosaic fails
the assembly, every time, saying how to repair it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from azure.storage.blob import ContainerClient

from ... import jobs
from ...errors import CommittedElsewhere, CopyFromUrlUnsupported, IncompatibleTilesError
from ...jobs import Job
from ...stores import JobStores
from ..reading.scene import SceneInfo
from . import attempt, blocks_strategy, server_strategy, vrt_strategy
from .checks import blob_properties
from .commit import MosaicResult, already_present, commit_and_verify, superseded
from .shares import StagedShares
from .strategy import BuiltMosaic, MosaicJob, Strategy, mosaic_job

logger = logging.getLogger(__name__)

METHODS = ("auto", "server", "blocks", "vrt")
STRATEGIES: dict[str, Strategy] = {
    "server": server_strategy.build,
    "blocks": blocks_strategy.build,
    "vrt": vrt_strategy.build,
}
#: Where ``auto`` goes when a strategy cannot build the mosaic: (what it raised, the next
#: strategy, the WARNING that says why, with the job id and the exception).
FALLBACKS: dict[str, tuple[tuple[type[Exception], str, str], ...]] = {
    "server": (
        (CopyFromUrlUnsupported, "blocks", "job %s: %s; the mosaic's bytes pass through this process instead"),
        (IncompatibleTilesError, "vrt", "job %s: tiles cannot be block-copied (%s); assembling through a VRT"),
    ),
    "blocks": ((IncompatibleTilesError, "vrt", "job %s: tiles cannot be block-copied (%s); assembling through a VRT"),),
}


def assemble_mosaic(
    job: Job,
    stores: JobStores,
    scene: SceneInfo,
    *,
    method: str = "auto",
    workdir: str | None = None,
    replace: dict[str, str | None] | None = None,
    shares: StagedShares | None = None,
    cost: Callable[[], dict] | None = None,
) -> MosaicResult:
    """Assemble the job's tiles into ``jobs.mosaic_blob_name(job.job_id)`` once, plus STAC item and
    quicklook. ``method``: "auto" (``server``, falling back as :data:`FALLBACKS` says), or one strategy.

    Raises :class:`IncompleteManifestError` (missing windows, a tile whose size differs from its
    row, or, server-side, a tile changed since its row: named by window). Attempts at the same
    time take no claim: one commit wins, the others return ``already-present`` (:mod:`.attempt`).
    ``workdir`` (default: a private temporary directory, removed afterwards) holds the coarse-level
    copy, or the VRT path's files. The job's spec decides the windows planned and the blocks laid
    out; the STAC item records it, and the job's blob name as the source.

    ``replace`` (a rebuild after a repair): ``{"mosaic": etag, "stac": etag, "quicklook": etag}``,
    the versions inspected before it (None: absent). The mosaic is then assembled whatever is
    there and committed with ``If-Match`` on its inspected ETag in the same one Put Block List
    (create-only where it was None), then its companions likewise (:func:`.sidecars.write_sidecars`);
    ``superseded`` (companions untouched) when something newer landed first.

    ``shares`` (the commit step of a split staging, :mod:`.shares`): the copied ranges were staged
    by share activities under that plan's ids; this call does everything else, as above. ``cost``
    gives what the job has cost so far; the STAC item made by this call records it.
    """
    _check_method(method, shares, replace)
    job_id, output, mosaic_name = job.job_id, stores.output, jobs.mosaic_blob_name(job.job_id)
    timings: dict[str, float] = {}
    committed_elsewhere = _committed_elsewhere(output, mosaic_name, replace)

    # 1. What is there: a mosaic already committed is not rebuilt (but verified, below), unless
    #    this is a rebuild of the version that was inspected.
    started = time.perf_counter()
    existing = blob_properties(output, mosaic_name)
    timings["exists_check"] = time.perf_counter() - started
    if replace is not None and committed_elsewhere():
        return superseded(job_id, timings)

    # 2. The plan: the manifest says every window is done, with the stored sizes (and ETags) it
    #    recorded. No claim: a dead attempt's temporary directories are removed, its staged
    #    blocks are never in our list (and are discarded by our commit).
    if workdir is None:
        attempt.sweep_dead_workdirs()
    with mosaic_job(
        job,
        stores,
        scene,
        timings,
        workdir=workdir,
        committed_elsewhere=committed_elsewhere,
        replace=replace,
        cost=cost,
    ) as assembly:
        return _built_or_present(assembly, existing is not None, method, shares)


def _check_method(method: str, shares: StagedShares | None, replace: dict | None) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if shares is not None and (method not in ("auto", "server") or replace is not None):
        raise ValueError("ranges staged in shares are committed by the server method, never as a rebuild")


def _built_or_present(assembly: MosaicJob, exists: bool, method: str, shares: StagedShares | None) -> MosaicResult:
    """Steps 3 to 5: a strategy builds the mosaic, the shared step commits and verifies it; or the
    mosaic committed before (``exists``) or by another attempt while this one staged, verified."""
    try:
        if exists and assembly.replace is None:
            return already_present(assembly)
        return commit_and_verify(assembly, build(assembly, method, shares))
    except CommittedElsewhere:
        if assembly.replace is not None:
            return superseded(assembly.job_id, assembly.timings)
        logger.info("job %s: another attempt committed the mosaic while this one staged; stopped", assembly.job_id)
        return already_present(assembly)


def build(job: MosaicJob, method: str, shares: StagedShares | None = None) -> BuiltMosaic:
    """The mosaic built by ``method``'s strategy, nothing committed; ``auto`` starts with
    ``server`` and follows :data:`FALLBACKS`, any other method raises what its strategy raised.
    ``shares``: the copied ranges the server strategy finds staged (:mod:`.shares`)."""
    name = "server" if method == "auto" else method
    while True:
        try:
            return server_strategy.build(job, shares) if name == "server" else STRATEGIES[name](job)
        except (CopyFromUrlUnsupported, IncompatibleTilesError) as exc:
            fallback = _fallback(name, exc) if method == "auto" else None
            if fallback is None:
                raise
            name, why = fallback
            logger.warning(why, job.job_id, exc)


def _fallback(name: str, exc: Exception) -> tuple[str, str] | None:
    for kind, next_name, why in FALLBACKS.get(name, ()):
        if isinstance(exc, kind):
            return next_name, why
    return None


def _committed_elsewhere(output: ContainerClient, mosaic_name: str, replace: dict | None) -> Callable[[], bool]:
    """Asks (one HEAD) whether someone else committed the mosaic: any mosaic at all, or, for a
    rebuild, a version other than the one it inspected."""

    def committed_elsewhere() -> bool:
        props = blob_properties(output, mosaic_name)
        if replace is None:
            return props is not None
        return (props.etag if props is not None else None) != replace.get("mosaic")

    return committed_elsewhere
