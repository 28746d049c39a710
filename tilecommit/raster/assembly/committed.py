"""The committed mosaic verified: what an assembly knows it must be, checked against the blob.

Every path that meets a committed mosaic (a fresh commit, a refused one, an attempt stopped
because another committed, a mosaic already there when the assembly starts, a scrub) verifies it
with :func:`verify_mosaic` before it is called done: committed by an assembly (its metadata names
the method, the level count and the evidence), block-copied ones of the planned size and head,
a streamed one's sha256 matched by its bytes, and every check of a fresh mosaic
(:func:`.checks.verify_committed_mosaic`). :func:`verify_outputs` is the same check with the
companions, writing nothing.
"""

from __future__ import annotations

import time

from ... import gates, jobs
from ...errors import IncompatibleTilesError, MosaicCheckError
from ...jobs import Job
from ...stores import JobStores
from ..reading.scene import SceneInfo
from .block_copy import plan_block_copy
from .checks import blob_properties, committed_properties, repair_instruction, verify_committed_mosaic
from .pyramid import levels_of
from .sidecars import write_sidecars
from .strategy import (
    COMMITTED_METHODS,
    METHOD_METADATA_KEY,
    OVERVIEW_LEVELS_METADATA_KEY,
    PLAN_SHA256_METADATA_KEY,
    MosaicJob,
    PlannedMosaic,
    mosaic_job,
)


def verify_mosaic(job: MosaicJob, planned: PlannedMosaic | None):
    """Verify the committed mosaic before it counts as done, whoever committed it; its properties.

    It must be what these tiles make, as far as that is known without building it again:
    committed by an assembly (its metadata names the method, the level count and the evidence);
    a block-copied one (``server``, ``blocks``) of the planned size, beginning with the planned
    header and directories, its evidence ours where the methods agree (planned from the tiles,
    :func:`.block_copy.plan_block_copy`, when this attempt has no block-copy plan: tile heads
    and coarse levels, nothing staged);
    a streamed sha256 this attempt cannot know, matched by the stored bytes (one full read); and
    every check of a fresh mosaic (:func:`verify_committed_mosaic`, :func:`check_mosaic_file`).

    A mosaic known bad raises :class:`MosaicCheckError` saying how to repair it (a re-run would
    meet the same mosaic); a check that storage kept from finishing raises a retryable fault.
    """
    name = job.mosaic_name
    started = time.perf_counter()
    props = committed_properties(job.stores.output, name)
    method = (props.metadata or {}).get(METHOD_METADATA_KEY, "")
    try:
        if method not in COMMITTED_METHODS:
            raise MosaicCheckError(
                f"committed mosaic {name}: no {METHOD_METADATA_KEY} in its metadata ({props.metadata}): "
                "no assembly committed it"
            )
        planned = _comparable_plan(job, method, planned)
        levels = planned.levels if planned is not None else levels_of(job.scene, job.spec)
        key = PLAN_SHA256_METADATA_KEY if method == "server" else gates.SHA256_METADATA_KEY
        ours = planned.evidence[1] if planned is not None and planned.evidence[0] == key else None
        verify_committed_mosaic(
            job,
            levels,
            nbytes=planned.nbytes if planned is not None else None,
            metadata={OVERVIEW_LEVELS_METADATA_KEY: str(levels), key: ours},
            head=planned.head if planned is not None else None,
            hash_content_from=key if ours is None and key == gates.SHA256_METADATA_KEY else None,
        )
    except MosaicCheckError as exc:
        raise MosaicCheckError(f"{exc}; {repair_instruction(job.job_id)}") from exc
    job.timings["verify"] = time.perf_counter() - started
    return props


def _comparable_plan(job: MosaicJob, method: str, planned: PlannedMosaic | None) -> PlannedMosaic | None:
    """The plan a committed ``method`` mosaic is compared with: this attempt's when it is of the
    same kind; for a block-copied one without it, one made from the tiles; for a VRT one, none."""
    if method == "vrt":
        return planned if planned is not None and planned.method == "vrt" else None
    if planned is not None and planned.method != "vrt":
        return planned
    try:
        return plan_block_copy(job)
    except IncompatibleTilesError as exc:
        raise MosaicCheckError(
            f"committed mosaic {job.mosaic_name} says it was block-copied ({method}), but its tiles cannot be: {exc}"
        ) from exc


def verify_outputs(job: Job, stores: JobStores, scene: SceneInfo) -> None:
    """Verify the committed mosaic and its companions as an assembly does before it calls them
    done (:func:`verify_mosaic`, :func:`.sidecars.write_sidecars`), writing nothing: a scrub's check.

    Raises :class:`MosaicCheckError` for an output that is missing or known bad,
    :class:`IncompleteManifestError` when the tiles themselves are not what their rows say.
    """
    name = jobs.mosaic_blob_name(job.job_id)
    if blob_properties(stores.output, name) is None:
        raise MosaicCheckError(f"{name} does not exist; {repair_instruction(job.job_id)}")
    with mosaic_job(job, stores, scene, {}) as assembly:
        verify_mosaic(assembly, None)
        write_sidecars(assembly, verify_only=True)
