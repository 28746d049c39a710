"""The one interface of the three ways to build a mosaic, and what a committed mosaic carries.

A strategy (:data:`Strategy`) is a function of one :class:`MosaicJob` that builds the mosaic and
commits nothing. It returns a :class:`BuiltMosaic`: what the one commit takes (staged block ids,
or a local file) and what the committed mosaic must then be (:class:`PlannedMosaic`). The shared
step (:func:`.commit.commit_and_verify`) commits and verifies it, whichever strategy built it:

- ``server`` (:mod:`.server_strategy`, the default): the storage service copies the tiles' blocks;
- ``blocks`` (:mod:`.blocks_strategy`): the same file, its bytes streamed through this process;
- ``vrt`` (:mod:`.vrt_strategy`): GDAL's COG driver over a VRT of the tiles.

A strategy that cannot build these tiles raises what sends ``auto`` on to the next one
(:class:`~tilecommit.errors.CopyFromUrlUnsupported`, :class:`~tilecommit.errors.IncompatibleTilesError`:
:data:`.mosaic.FALLBACKS`); one that meets the mosaic committed by another attempt while it
stages raises :class:`~tilecommit.errors.CommittedElsewhere`. Whichever way it leaves, it leaves
no request of its own in flight.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ... import jobs
from ...grid import Window
from ...jobs import Job
from ...manifest import ManifestSummary
from ...spec import OutputSpec
from ...stores import JobStores
from ..reading.scene import SceneInfo
from . import attempt
from .manifest_check import check_manifest

#: Blob metadata key recording the mosaic's overview level count (read back by a duplicate call).
OVERVIEW_LEVELS_METADATA_KEY = "overview_levels"
#: Blob metadata key of a server-side mosaic's evidence: the sha256 of its plan (head, ranges and
#: the sha256 of the tile each comes from), since no one reads its bytes to hash them.
PLAN_SHA256_METADATA_KEY = "plan_sha256"
#: Blob metadata key naming the strategy that made the mosaic: one of :data:`COMMITTED_METHODS`.
METHOD_METADATA_KEY = "method"
COMMITTED_METHODS = ("server", "blocks", "vrt")


@dataclass(frozen=True)
class MosaicJob:
    """One assembly of one job's tiles, as the strategies, the commit and the verification see it;
    made by :func:`mosaic_job`.

    ``windows`` and ``summary`` are what the manifest check returned (every planned window, its
    row); ``workdir`` is the attempt's own temporary directory; every step adds its seconds to
    ``timings``. ``committed_elsewhere`` asks whether someone else committed the mosaic meanwhile
    (a strategy that stages stops then). ``replace`` (a rebuild): the versions of the mosaic and
    its companions inspected before it (None: absent); ``cost`` is what the STAC item records.
    """

    job: Job
    stores: JobStores
    scene: SceneInfo
    windows: list[Window]
    summary: ManifestSummary
    workdir: str
    timings: dict[str, float]
    committed_elsewhere: Callable[[], bool] | None = None
    replace: dict[str, str | None] | None = None
    cost: Callable[[], dict] | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id

    @property
    def spec(self) -> OutputSpec:
        return self.job.spec

    @property
    def mosaic_name(self) -> str:
        return jobs.mosaic_blob_name(self.job_id)


@contextmanager
def mosaic_job(
    job: Job,
    stores: JobStores,
    scene: SceneInfo,
    timings: dict[str, float],
    *,
    workdir: str | None = None,
    committed_elsewhere: Callable[[], bool] | None = None,
    replace: dict[str, str | None] | None = None,
    cost: Callable[[], dict] | None = None,
) -> Iterator[MosaicJob]:
    """The assembly of ``job``'s tiles once the manifest says every planned window is done, with
    the stored sizes it recorded (:func:`.manifest_check.check_manifest`, raised from here).

    ``workdir`` None: a temporary directory of the attempt's own (:func:`.attempt.new_workdir`),
    removed when the assembly leaves; one given is the caller's to remove.
    """
    started = time.perf_counter()
    windows, summary = check_manifest(job, stores, scene)
    timings["manifest"] = time.perf_counter() - started
    own_workdir = workdir is None
    workdir = attempt.new_workdir(job.job_id) if workdir is None else workdir
    try:
        yield MosaicJob(
            job,
            stores,
            scene,
            windows,
            summary,
            workdir=workdir,
            timings=timings,
            committed_elsewhere=committed_elsewhere,
            replace=replace,
            cost=cost,
        )
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class PlannedMosaic:
    """What an assembly knows its mosaic must be, to verify a committed one against.

    ``method`` is the strategy that planned it; ``evidence`` the metadata (key, value) its commit
    carries: a streamed sha256, or a server-side plan's digest. ``nbytes`` is its planned size
    and ``head`` its planned header and directories (block copy only: a VRT mosaic has no head
    before GDAL has written the whole file).
    """

    method: str
    levels: int
    evidence: tuple[str, str]
    nbytes: int
    head: bytes | None = None


@dataclass(frozen=True)
class BuiltMosaic:
    """A mosaic a strategy built and did not commit.

    What the commit takes: ``block_ids``, the blocks staged for it in file order (one Put Block
    List), or ``path``, a local file (uploaded whole). ``sha256``: its bytes' digest where they
    passed through this process (empty when the service copied them; ``planned.evidence`` is
    then the plan's digest). ``planned``: what the committed mosaic must be. ``transfer``: the
    bytes and requests it took (``copied_by_service``, ``sent_from_instance``, ``staged_blocks``, ...).
    """

    planned: PlannedMosaic
    transfer: dict[str, int]
    sha256: str = ""
    block_ids: list[str] | None = None
    path: str | None = None

    @property
    def method(self) -> str:
        return self.planned.method


#: A way to build the mosaic, one module each (``server``, ``blocks``, ``vrt``): builds, commits nothing.
Strategy = Callable[[MosaicJob], BuiltMosaic]
