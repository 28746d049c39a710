"""The one step every strategy ends in: what it built, committed once, and the committed mosaic verified.

:func:`commit_and_verify` commits a :class:`~.strategy.BuiltMosaic` with one create-only request
(Put Block List over its staged blocks, or the upload of its file: :mod:`.staging` makes the
requests), carrying its evidence, level count and method; in a rebuild, ``If-Match`` on the
version inspected instead. Whatever holds the name then is verified before anyone calls it done:

- ``written`` (ours): checked again through the pinned reader (:func:`.committed.verify_mosaic`);
- ``already-present`` (another attempt's, and a mosaic found there before anything was built:
  :func:`already_present`): verified the same way against what this attempt planned, or, when
  it planned nothing, against what the tiles make;
- ``superseded`` (a rebuild overtaken by a newer version): left as it is, companions untouched.

Then the companions, written or verified (:func:`.sidecars.write_sidecars`). Every way out is a
:class:`MosaicResult`; one known bad is a :class:`~tilecommit.errors.MosaicCheckError`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TypedDict

from ... import gates, jobs
from ...records import Record
from .committed import verify_mosaic
from .sidecars import write_sidecars
from .staging import commit_file, commit_staged_blob
from .strategy import METHOD_METADATA_KEY, OVERVIEW_LEVELS_METADATA_KEY, BuiltMosaic, MosaicJob, PlannedMosaic

logger = logging.getLogger(__name__)

COG_CONTENT_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"


@dataclass(frozen=True)
class MosaicResult(Record):
    """What one assembly did: its outcome, the three outputs' names, the mosaic's size and level
    count, the strategy that built it (``none`` when it was already there) and what it cost."""

    outcome: str
    mosaic: str
    stac: str
    quicklook: str
    nbytes: int
    overview_levels: int
    timings: dict[str, float] = field(default_factory=dict)
    method: str = ""
    sha256: str = ""
    #: Bytes and requests of the assembly: ``copied_by_service``, ``sent_from_instance``, ``staged_blocks``.
    transfer: dict[str, int] = field(default_factory=dict)

    JSON_IN = {"timings": lambda timings: dict(timings or {}), "transfer": lambda counts: dict(counts or {})}


class OutputNames(TypedDict):
    mosaic: str
    stac: str
    quicklook: str


def output_names(job_id: str) -> OutputNames:
    """The job's three outputs by the name :class:`MosaicResult` gives each."""
    return OutputNames(
        mosaic=jobs.mosaic_blob_name(job_id),
        stac=jobs.stac_blob_name(job_id),
        quicklook=jobs.quicklook_blob_name(job_id),
    )


def commit_and_verify(job: MosaicJob, built: BuiltMosaic) -> MosaicResult:
    """Commit ``built`` once, create-only (``If-Match`` in a rebuild), verify what holds the name, and
    write or verify the companions."""
    started = time.perf_counter()
    outcome = _commit(job, built)
    job.timings["upload"] = time.perf_counter() - started
    if built.path is not None:
        os.remove(built.path)
    if outcome is gates.Outcome.SUPERSEDED:
        return superseded(job.job_id, job.timings)
    if outcome is gates.Outcome.ALREADY_PRESENT:
        return already_present(job, built.planned)
    # The committed blob, checked again through the pinned reader with the same function, after
    # the commit because there is no file to check before: the bytes went straight to storage.
    # The layout was checked before staging, the bytes are a deterministic function of the tiles
    # (server-side: of the very tile versions the manifest recorded), and the list committed
    # names only this attempt's blocks. A failure here is a bug (the writer or the service did
    # not produce what was planned) that repeating would not fix, so it is raised loudly
    # (MosaicCheckError, not retryable) and the blob is left in place to be examined; every
    # later assembly verifies it again and fails the same way.
    verify_mosaic(job, built.planned)
    write_sidecars(job, replace=job.replace)
    planned = built.planned
    logger.info(
        "job %s: mosaic %s (%s, %d bytes, %d overview levels, %s, %s)",
        job.job_id,
        outcome,
        built.method,
        planned.nbytes,
        planned.levels,
        built.transfer,
        {k: round(v, 3) for k, v in job.timings.items()},
    )
    return MosaicResult(
        outcome=str(outcome),
        nbytes=planned.nbytes,
        overview_levels=planned.levels,
        timings=job.timings,
        method=built.method,
        sha256=built.sha256,
        transfer=built.transfer,
        **output_names(job.job_id),
    )


def _commit(job: MosaicJob, built: BuiltMosaic) -> gates.Outcome:
    """The one conditional request. A server-side mosaic's evidence is its plan's digest (each
    tile's sha256 included), since its bytes never pass through here."""
    metadata = {OVERVIEW_LEVELS_METADATA_KEY: str(built.planned.levels), METHOD_METADATA_KEY: built.method}
    expect_etag = (job.replace or {}).get("mosaic")
    if built.path is not None:
        return commit_file(
            job.stores.output,
            job.mosaic_name,
            built.path,
            sha256=built.sha256,
            content_type=COG_CONTENT_TYPE,
            job_id=job.job_id,
            metadata=metadata,
            expect_etag=expect_etag,
        )
    if built.block_ids is None:
        raise AssertionError(f"the {built.method} strategy built neither a file nor staged blocks")
    return commit_staged_blob(
        job.stores.output,
        job.mosaic_name,
        built.block_ids,
        sha256=built.sha256,
        evidence=built.planned.evidence,
        content_type=COG_CONTENT_TYPE,
        job_id=job.job_id,
        metadata=metadata,
        expect_etag=expect_etag,
    )


def already_present(job: MosaicJob, planned: PlannedMosaic | None = None) -> MosaicResult:
    """The mosaic someone committed (an earlier execution, a duplicate, anything with write
    access), verified against ``planned`` (None: what the tiles make) before it counts as done;
    its companions are written if a crash left them out, and verified if not."""
    stored = verify_mosaic(job, planned)
    write_sidecars(job)
    metadata = stored.metadata or {}
    return MosaicResult(
        outcome=str(gates.Outcome.ALREADY_PRESENT),
        nbytes=int(stored.size),
        overview_levels=int(metadata.get(OVERVIEW_LEVELS_METADATA_KEY, -1)),
        timings=job.timings,
        method="none",
        sha256=metadata.get(gates.SHA256_METADATA_KEY, ""),
        **output_names(job.job_id),
    )


def superseded(job_id: str, timings: dict[str, float]) -> MosaicResult:
    """A rebuild overtaken: the mosaic is no longer the version it inspected, so it is left as it is."""
    logger.info("job %s: the mosaic changed since it was inspected for a rebuild; left as it is", job_id)
    return MosaicResult(
        outcome=str(gates.Outcome.SUPERSEDED), nbytes=0, overview_levels=-1, timings=timings, **output_names(job_id)
    )
