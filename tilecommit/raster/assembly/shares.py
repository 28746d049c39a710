"""The mosaic's server-side staging split over several activities: plan, shares, one commit.

One activity stages the whole mosaic for small scenes (:func:`.mosaic.assemble_mosaic`). For a
large one its copied ranges are staged in shares, each by an activity of its own, so no single
activity's copy has to fit the function's time limit, and the shares can run on several
instances at once:

1. :func:`plan_shares` reads the tiles' heads (pinned to the ETags their manifest rows
   recorded; those the reduction tree carries come with its intermediates: all of them with the
   last node, or 16 a read from the first stage's for a job from before), plans the ranges the
   service copies (:class:`.copy_plan.CopyRange`, the same ranges in the same order as the
   one-activity plan: the tiles' own levels and the tree's intermediates, whose layout the tree
   carries; coarse levels computed by the commit are local blocks, not ranges), cuts them into
   contiguous shares and records it all as one create-only blob, the :class:`SharePlan` named by
   its ``tag``;
2. :func:`stage_share` stages one share's ranges, read from that plan blob at the version the
   planning step recorded, under the plan's block ids (:meth:`ServerSideStager.stage_ranges`:
   range ``k`` is ``block_id(tag, k)``), each pinned to its tile's (or intermediate's) ETag;
3. the commit is the one-activity assembly given the plan (``assemble_mosaic(shares=...)``): it
   plans the whole mosaic again (tile heads, coarse levels, head), refuses unless its ranges and
   versions are exactly the plan's, stages only the head and any local coarse levels, and commits
   one create-only Put Block List naming the plan's range ids and its own local ids.

Why this is safe to run at least once, concurrently, retried (docs/raster.md, "Staging in shares"):
a range's id names one (tile version, offset, length) through the plan blob, which is written
once and read pinned to its ETag; the service copies exactly that version's bytes or refuses
(412). So every staging of an id, by any execution of any share, stages the same bytes. The tag
is named by the ranges and the tile versions (:func:`.server_copy.ranges_tag`), so every attempt
over the same tiles stages the same ids with the same bytes, and an attempt over other versions
(a repaired tile) stages ids of its own, which never enter another's list.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from azure.core import MatchConditions
from azure.storage.blob import ContainerClient

from ... import gates, jobs
from ...errors import (
    CommittedElsewhere,
    CopyFromUrlUnsupported,
    IncompatibleTilesError,
    IncompleteManifestError,
    MosaicCheckError,
    StagingPlanChangedError,
)
from ...jobs import Job
from ...records import Record
from ...storage_answers import STORAGE_ERRORS, call_failed, classify
from ...stores import JobStores
from ...usage import ContextExecutor
from ..reading.scene import SceneInfo
from .block_copy import copied_sources, read_tile_levels, tree_levels
from .block_sources import FETCH_THREADS, Head
from .checks import blob_properties
from .coarse_levels import carried_heads, check_tree_contents, read_carried_intermediates
from .copy_plan import CopyPlan, CopyRange, cut_shares, plan_copy
from .manifest_check import check_manifest
from .reduction import plan_level_tree
from .server_copy import ServerSideStager, copy_source_for, ranges_tag

logger = logging.getLogger(__name__)


#: Shares of one mosaic at most: one activity each in the job's history (cut_shares doubles the
#: share size above it).
MAX_SHARES = 64
PLAN_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class SharePlan:
    """One attempt's split staging: its tag, the ranges in file order (range ``k`` is block
    ``block_id(tag, k)``), the tile version and blob of each window, and the shares."""

    job_id: str
    tag: str
    ranges: list[CopyRange]
    versions: dict[str, str | None]
    uris: dict[str, str]
    shares: list[tuple[int, int]]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "job_id": self.job_id,
                "tag": self.tag,
                "ranges": [[r.source, r.offset, r.length] for r in self.ranges],
                "versions": self.versions,
                "uris": self.uris,
                "shares": [list(s) for s in self.shares],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, body: bytes) -> SharePlan:
        data = json.loads(body)
        return cls(
            job_id=data["job_id"],
            tag=data["tag"],
            ranges=[CopyRange(source, offset, length) for source, offset, length in data["ranges"]],
            versions=data["versions"],
            uris=data["uris"],
            shares=[(start, stop) for start, stop in data["shares"]],
        )


@dataclass(frozen=True)
class StagedShares(Record):
    """What the orchestration carries of a plan: its blob and the version the planning step
    recorded, the attempt's tag, and the sizes (small JSON, never the ranges)."""

    name: str
    etag: str
    tag: str
    shares: int
    ranges: int
    copied_bytes: int


def planned_ranges(levels, coarse: list | None = None) -> CopyPlan:
    """The copy plan of the tiles' own levels (:class:`.block_copy.TileLevels`) and, where the
    service copies the tree's intermediates, their ``coarse`` levels: its ranges are the whole
    mosaic's, in the same order (any other coarse levels are local blocks before them)."""
    head, order, total = levels.writer.block_order([*levels.directories, *(coarse or [])])
    return plan_copy(head, order, total, leaders=levels.writer.leaders, trailers=levels.writer.trailers)


def plan_shares(job: Job, stores: JobStores, scene: SceneInfo, *, share_bytes: int) -> StagedShares | str:
    """Plan the split staging of the mosaic and record it (create-only), named by its tag.

    Returns the :class:`StagedShares`, or why the mosaic is assembled by one activity instead:
    it exists already (that path verifies it), its tiles cannot be block-copied, or its copy
    fits one share. Raises :class:`IncompleteManifestError` as the assembly does.
    """
    job_id, tiles = job.job_id, stores.tiles
    mosaic = jobs.mosaic_blob_name(job_id)
    if blob_properties(stores.output, mosaic) is not None:
        return "the mosaic exists already"
    windows, summary = check_manifest(job, stores, scene)
    timings: dict[str, float] = {}
    tree = plan_level_tree(scene.width, scene.height, job.spec, job.coarse_levels_per_node)
    intermediates, coarse = None, None
    known: dict[str, Head] | None
    try:
        with ContextExecutor(max_workers=FETCH_THREADS, thread_name_prefix="tilefetch") as executor:
            # The orchestration runs the tree first: its intermediates carry the tiles' heads (the
            # last one all of them, or each of the first stage's 16), not one request a tile.
            if tree is not None and job.coarse_levels_copied:
                intermediates = read_carried_intermediates(job, stores, tree, executor)
                check_tree_contents(intermediates, windows, summary, job_id)
                known = intermediates.heads
            else:
                known = carried_heads(job, stores, tree, executor) if tree is not None else None
            levels = read_tile_levels(
                scene, windows, summary, tiles=tiles, spec=job.spec, timings=timings, executor=executor, known=known
            )
    except IncompatibleTilesError as exc:
        return f"the tiles cannot be block-copied ({exc})"
    if intermediates is not None:  # the service copies the intermediates' blocks too: they are ranges
        coarse = tree_levels(scene, job.spec, levels, intermediates, copied=True)
    ranges = planned_ranges(levels, coarse).ranges
    shares = cut_shares(ranges, share_bytes, MAX_SHARES)
    if len(shares) < 2:
        return f"its copy ({sum(r.length for r in ranges)} bytes) fits one share of {share_bytes}"
    versions, uris = copied_sources(windows, summary, intermediates.rows if intermediates is not None else {})
    tag = ranges_tag(job_id, ranges, versions)
    plan = SharePlan(job_id=job_id, tag=tag, ranges=ranges, versions=versions, uris=uris, shares=shares)
    name = jobs.share_plan_blob_name(job_id, tag)
    # Another execution of this step, of any attempt, with the same tiles finds the same plan
    # there (the tag names its ranges and versions): the stored one is used, whatever this
    # execution computed, and the commit checks its own ranges against it.
    _, stored = gates.commit_blob_versioned(tiles, name, plan.to_json(), content_type=PLAN_CONTENT_TYPE, job_id=job_id)
    staged = StagedShares(
        name=name,
        etag=stored.etag,
        tag=tag,
        shares=len(shares),
        ranges=len(ranges),
        copied_bytes=sum(r.length for r in ranges),
    )
    logger.info("job %s: mosaic staging planned in %d shares (%s, %s)", job_id, len(shares), staged, timings)
    return staged


def read_share_plan(tiles: ContainerClient, staged: StagedShares) -> SharePlan:
    """The plan blob at the version the planning step recorded (If-Match), never another."""
    blob = tiles.get_blob_client(staged.name)
    try:
        body = blob.download_blob(etag=staged.etag, match_condition=MatchConditions.IfNotModified).readall()
    except STORAGE_ERRORS as exc:
        answer = classify(exc)
        if answer.version_gone:
            raise StagingPlanChangedError(
                f"the mosaic's staging plan {staged.name} is not the version its attempt recorded "
                f"({staged.etag}): {answer.status}; nothing was committed, deliver the upload again"
            ) from exc
        raise call_failed("reading", staged.name, exc) from exc
    plan = SharePlan.from_json(body)
    if plan.tag != staged.tag:
        raise MosaicCheckError(f"{staged.name} holds the plan of attempt {plan.tag}, not {staged.tag}")
    return plan


def stage_share(job: Job, stores: JobStores, staged: StagedShares, index: int) -> dict:
    """Stage share ``index`` of the plan; ``{"share", "ranges", "bytes", "stopped", ...}``.

    ``stopped``: the mosaic was committed meanwhile (by anyone), so the rest is not staged (the
    commit step then verifies that mosaic). ``unsupported``: the service has no Put Block From
    URL; the orchestration then assembles in one activity, which streams the bytes itself.
    Raises :class:`IncompleteManifestError` naming the window when a tile changed since its row.
    """
    job_id, tiles, output = job.job_id, stores.tiles, stores.output
    plan = read_share_plan(tiles, staged)
    start, stop = plan.shares[index]
    name = jobs.mosaic_blob_name(job_id)
    stager = ServerSideStager(
        output.get_blob_client(name),
        tiles,
        uris=plan.uris,
        etags=plan.versions,
        copy_source=copy_source_for(tiles),
        read_local=_no_local_blocks,
        leaders=False,
        trailers=False,
        committed_elsewhere=lambda: blob_properties(output, name) is not None,
        range_tag=plan.tag,
    )
    share = plan.ranges[start:stop]
    result = {"share": index, "ranges": len(share), "bytes": sum(r.length for r in share), "stopped": False}
    try:
        stager.stage_ranges(share, first=start)
    except CommittedElsewhere:
        logger.info("job %s: share %d stopped, the mosaic was committed meanwhile", job_id, index)
        return {**result, "stopped": True, "staged": stager.ranges_staged}
    except CopyFromUrlUnsupported as exc:
        return {**result, "unsupported": str(exc), "staged": 0}
    return {**result, "staged": stager.ranges_staged}


def _no_local_blocks(ref):
    raise AssertionError(f"a share stages ranges only, not the local block at {ref.offset}")


def check_against_plan(plan: SharePlan, copy: CopyPlan, versions: dict[str, str | None]) -> None:
    """Refuse to commit unless the shares staged exactly what this mosaic copies: the same tile
    versions (a row changed since planning names its window) and the same ranges in the same order."""
    changed = sorted(w for w, etag in versions.items() if plan.versions.get(w, "") != etag)
    if changed:
        raise IncompleteManifestError(
            f"job {plan.job_id}: the manifest rows of {len(changed)} windows ({', '.join(changed[:20])}) name other "
            f"tile versions than the staging plan {plan.tag} was made from; nothing was committed, deliver the upload again",
            mismatched=changed,
        )
    if copy.ranges != plan.ranges:
        raise MosaicCheckError(
            f"job {plan.job_id}: the mosaic's copy ranges ({len(copy.ranges)}) differ from those of staging plan "
            f"{plan.tag} ({len(plan.ranges)}) over the same tile versions"
        )


__all__ = [
    "MAX_SHARES",
    "SharePlan",
    "StagedShares",
    "check_against_plan",
    "plan_shares",
    "read_share_plan",
    "stage_share",
]
