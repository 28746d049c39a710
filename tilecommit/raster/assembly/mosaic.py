"""Assemble a job's tiles into one COG mosaic, committed once, with its STAC item and quicklook.

Three ways to build the mosaic, all exact at full resolution (``method``):

``server`` (the default): block copy done by the storage service. The mosaic's full resolution
and the overview levels the tiles carry are the tiles' own compressed blocks in a new TIFF layout
(:mod:`.block_copy`); the service stages them from byte ranges of the tile blobs (Put Block From
URL, each range pinned to the tile version the manifest recorded: :mod:`.server_copy`,
:mod:`.copy_plan`). Only the head (header and directories) and the coarse levels, computed from
the tiles' smallest reused level, pass through this process.

``blocks``: the same layout, but the bytes pass through this process (ranged reads of the tiles,
Put Block of the stream: :class:`.staging.StagedBlockSink`). Used when the service does not
implement Put Block From URL (an older emulator answers 501), and by the benchmark.

``vrt``: a VRT over the tiles translated by GDAL's COG driver (:mod:`.vrt`), only when the tiles
cannot be block-copied.

Either way the planned or written mosaic is checked (:mod:`.checks`: size, bands,
georeferencing, every overview level) before it is committed, with one Put Block List (or Put
Blob) carrying ``If-None-Match: *``, and the committed blob is checked again through /vsiaz/.
A mosaic that is already there, whoever committed it, is verified the same way against what the
tiles make before anyone calls it done (:func:`.committed.verify_mosaic`); one known bad fails the
assembly, every time, saying how to repair it.
No claim: each attempt stages under block ids of its own (:mod:`.attempt`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from ... import gates, jobs
from ...errors import CommittedElsewhere, CopyFromUrlUnsupported, IncompatibleTilesError, MosaicCheckError
from ...records import Record
from ...settings import Settings
from ...spec import OutputSpec
from ..reading.scene import SceneInfo
from . import attempt
from .block_copy import build_mosaic_blocks
from .checks import (
    blob_properties,
    check_manifest,
    check_mosaic_file,
    check_planned_mosaic,
    verify_committed_mosaic,
)
from .committed import (
    METHOD_METADATA_KEY,
    OVERVIEW_LEVELS_METADATA_KEY,
    PlannedMosaic,
    planned_block_copy,
    verifier,
)
from .pyramid import mosaic_overview_levels
from .server_copy import ServerSideStager, copy_source_for
from .shares import StagedShares, check_against_plan, read_share_plan
from .sidecars import write_sidecars
from .staging import STAGE_IN_FLIGHT, StagedBlockSink, commit_file, commit_staged_blob
from .vrt import build_mosaic_vrt, estimate_vrt_temp_bytes

logger = logging.getLogger(__name__)

COG_CONTENT_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
METHODS = ("auto", "server", "blocks", "vrt")


@dataclass(frozen=True)
class MosaicResult(Record):
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


def _server_side(
    job_id: str,
    scene: SceneInfo,
    windows,
    summary,
    *,
    tiles: ContainerClient,
    output: ContainerClient,
    settings: Settings,
    spec: OutputSpec,
    workdir: str,
    timings: dict[str, float],
    committed_elsewhere,
    shares: StagedShares | None = None,
) -> tuple[list[str], PlannedMosaic, dict]:
    """Plan the block-copy mosaic, check its head, and have the service stage it (:mod:`.server_copy`).

    ``shares``: the copied ranges were staged by share activities (:mod:`.shares`); only the head
    and coarse levels are staged here, once the plan is found to be the shares' own.
    Returns (block ids, the planned mosaic, byte counts). Nothing is committed.
    """
    mosaic_name = jobs.mosaic_blob_name(job_id)
    with planned_block_copy(
        job_id, scene, windows, summary, tiles=tiles, settings=settings, spec=spec, workdir=workdir, timings=timings
    ) as copy:
        unpinned = [w for w, etag in copy.versions.items() if not etag]
        if unpinned:
            logger.warning(
                "job %s: %d manifest rows (e.g. %s) predate recorded ETags: their tiles are copied unpinned",
                job_id,
                len(unpinned),
                unpinned[0],
            )
        layout = copy.layout
        share_plan = read_share_plan(tiles, shares) if shares is not None else None
        if share_plan is not None:
            check_against_plan(share_plan, copy.plan, copy.versions)
        stager = ServerSideStager(
            output.get_blob_client(mosaic_name),
            tiles,
            uris={w.id: summary.entries[w.id].uri for w in windows},
            etags=copy.versions,
            copy_source=copy_source_for(tiles),
            read_local=lambda ref: layout.sources[ref.source].read(ref.offset, ref.length),
            leaders=layout.writer.leaders,
            trailers=layout.writer.trailers,
            committed_elsewhere=committed_elsewhere,
            range_tag=share_plan.tag if share_plan is not None else None,
        )
        started = time.perf_counter()
        block_ids = stager.stage(copy.plan, ranges_staged=share_plan is not None)
        timings["write"] = time.perf_counter() - started
    counts = {
        "copied_by_service": copy.plan.copied_bytes,
        "sent_from_instance": stager.local_bytes_sent,
        "staged_blocks": len(block_ids),
        "copy_ranges": len(copy.plan.ranges),
        "shares": shares.shares if shares is not None else 1,
    }
    planned = copy.planned
    return block_ids, planned, counts


def assemble_mosaic(
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
    method: str = "auto",
    workdir: str | None = None,
    replace: dict[str, str | None] | None = None,
    shares: StagedShares | None = None,
    cost: Callable[[], dict] | None = None,
) -> MosaicResult:
    """Assemble the job's tiles into ``jobs.mosaic_blob_name(job_id)`` once, plus STAC item and quicklook.

    ``method``: "auto" (server-side block copy; through this process when the service lacks Put
    Block From URL; VRT when the tiles cannot be block-copied), "server", "blocks" or "vrt".
    Raises :class:`IncompleteManifestError` (missing windows, a tile whose size differs from its
    row, or, server-side, a tile changed since its row: named by window). Attempts running at
    the same time take no claim and never wait for each other: each stages under block ids of
    its own, the create-only commit lets one mosaic through and the other attempts return
    ``already-present`` (see :mod:`tilecommit.raster.assembly.attempt`). ``workdir`` (default: a private
    temporary directory, removed afterwards) holds the coarse-level copy, or the VRT path's files.
    ``spec`` is the job's output spec: the windows planned and the blocks laid out are its; the
    STAC item records it.

    ``replace`` (a rebuild after a repair): ``{"mosaic": etag, "stac": etag, "quicklook": etag}``,
    the versions inspected before it (None: absent). The mosaic is then assembled whatever is
    there and committed with ``If-Match`` on its inspected ETag in the same one Put Block List
    (create-only where it was None), then its companions likewise (:func:`write_sidecars`);
    ``superseded`` (companions untouched) when something newer landed first.

    ``shares`` (the commit step of a split staging, :mod:`.shares`): the copied ranges were staged
    by share activities under that plan's ids; this call does everything else, as above.

    ``cost`` gives what the job has cost so far; the STAC item made by this call records it.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if shares is not None and (method not in ("auto", "server") or replace is not None):
        raise ValueError("ranges staged in shares are committed by the server method, never as a rebuild")
    mosaic_name = jobs.mosaic_blob_name(job_id)
    names = dict(mosaic=mosaic_name, stac=jobs.stac_blob_name(job_id), quicklook=jobs.quicklook_blob_name(job_id))
    timings: dict[str, float] = {}
    sidecars = dict(
        output=output,
        settings=settings,
        spec=spec,
        source_name=source_name,
        timings=timings,
        cost=cost,
    )

    def superseded() -> MosaicResult:
        logger.info("job %s: the mosaic changed since it was inspected for a rebuild; left as it is", job_id)
        return MosaicResult(
            outcome=str(gates.Outcome.SUPERSEDED), nbytes=0, overview_levels=-1, timings=timings, **names
        )

    def committed_elsewhere() -> bool:
        # A rebuild (replace) was overtaken when the mosaic is no longer the version it inspected.
        props = blob_properties(output, mosaic_name)
        if replace is None:
            return props is not None
        return (props.etag if props is not None else None) != replace.get("mosaic")

    # 1. Cheap check first: a mosaic already there is not rebuilt (but verified, below), unless
    #    this is a rebuild of the version that was inspected.
    started = time.perf_counter()
    existing = blob_properties(output, mosaic_name)
    timings["exists_check"] = time.perf_counter() - started
    if replace is not None and committed_elsewhere():
        return superseded()
    expect_etag = (replace or {}).get("mosaic")

    # 2. The manifest says every window is done, with the stored sizes (and ETags) it recorded.
    started = time.perf_counter()
    windows, summary = check_manifest(job_id, scene, tiles=tiles, manifest=manifest, spec=spec)
    timings["manifest"] = time.perf_counter() - started

    # 3. No claim: a dead attempt's temporary directories are removed, its staged blocks are
    #    never in our list (and are discarded by our commit).
    own_workdir = workdir is None
    if own_workdir:
        attempt.sweep_dead_workdirs()
        workdir = attempt.new_workdir(job_id)

    verify = verifier(
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
    )

    def already_present(planned: PlannedMosaic | None) -> MosaicResult:
        # Whoever committed it (an earlier execution, a duplicate, anything with write access),
        # it is verified before it counts as done; its companions are written if a crash left
        # them out, and verified if not.
        stored = verify(planned)
        write_sidecars(job_id, scene, **sidecars)
        metadata = stored.metadata or {}
        return MosaicResult(
            outcome=str(gates.Outcome.ALREADY_PRESENT),
            nbytes=int(stored.size),
            overview_levels=int(metadata.get(OVERVIEW_LEVELS_METADATA_KEY, -1)),
            timings=timings,
            method="none",
            sha256=metadata.get(gates.SHA256_METADATA_KEY, ""),
            **names,
        )

    sink: StagedBlockSink | None = None
    used = method
    sha256 = ""
    counts: dict = {}
    try:
        if existing is not None and replace is None:
            return already_present(None)
        if method in ("auto", "server"):
            # 4a. The service stages the mosaic from the tiles; the planned head was checked first.
            try:
                block_ids, planned, counts = _server_side(
                    job_id,
                    scene,
                    windows,
                    summary,
                    tiles=tiles,
                    output=output,
                    settings=settings,
                    spec=spec,
                    workdir=workdir,
                    timings=timings,
                    committed_elsewhere=committed_elsewhere,
                    shares=shares,
                )
                used = "server"
            except CopyFromUrlUnsupported as exc:
                if method == "server":
                    raise
                logger.warning("job %s: %s; the mosaic's bytes pass through this process instead", job_id, exc)
                used = "blocks"
            except IncompatibleTilesError as exc:
                if method == "server":
                    raise
                logger.warning("job %s: tiles cannot be block-copied (%s); assembling through a VRT", job_id, exc)
                used = "vrt"
        if used == "blocks":
            # 4b. Block copy through this process: the planned head is checked, then the file goes
            #     front to back into staged blocks of the output blob.
            sink = StagedBlockSink(output.get_blob_client(mosaic_name), committed_elsewhere=committed_elsewhere)
            planned_head: list[bytes] = []

            def check_head(head: bytes, planned_levels: int) -> None:
                check_planned_mosaic(
                    head, scene, planned_levels, settings=settings, job_id=job_id, block_size=spec.block_size
                )
                planned_head.append(head)

            try:
                written, levels = build_mosaic_blocks(
                    job_id,
                    scene,
                    windows,
                    summary,
                    sink,
                    tiles=tiles,
                    settings=settings,
                    spec=spec,
                    workdir=workdir,
                    timings=timings,
                    check_head=check_head,
                )
            except IncompatibleTilesError as exc:
                sink.abort()
                sink = None
                if method == "blocks":
                    raise
                logger.warning("job %s: tiles cannot be block-copied (%s); assembling through a VRT", job_id, exc)
                used = "vrt"
            else:
                block_ids = sink.close()
                if sink.nbytes != written.nbytes:
                    raise AssertionError(f"streamed {sink.nbytes} bytes, the writer wrote {written.nbytes}")
                sha256 = written.sha256
                planned = PlannedMosaic(
                    "blocks",
                    levels,
                    (gates.SHA256_METADATA_KEY, sha256),
                    nbytes=written.nbytes,
                    head=planned_head[0],
                )
                counts = {"sent_from_instance": written.nbytes, "staged_blocks": len(block_ids)}

        if used in ("server", "blocks"):
            # 5. One create-only Put Block List. A server-side mosaic's evidence is its plan's
            #    digest (each tile's sha256 included), since its bytes never pass through here.
            started = time.perf_counter()
            outcome = commit_staged_blob(
                output,
                mosaic_name,
                block_ids,
                sha256=sha256,
                evidence=planned.evidence,
                content_type=COG_CONTENT_TYPE,
                job_id=job_id,
                metadata={OVERVIEW_LEVELS_METADATA_KEY: str(planned.levels), METHOD_METADATA_KEY: used},
                expect_etag=expect_etag,
            )
            timings["upload"] = time.perf_counter() - started
        else:
            # The VRT path: GDAL's COG driver writes a file (whose size build_mosaic_vrt estimates
            # and warns about), checked before its create-only upload.
            out_path = os.path.join(workdir, "mosaic.tif")
            nbytes, levels = build_mosaic_vrt(
                scene,
                windows,
                summary,
                out_path,
                tiles=tiles,
                settings=settings,
                spec=spec,
                gdal_options=gdal_options,
                workdir=workdir,
                timings=timings,
            )
            sha256 = _file_sha256(out_path)
            started = time.perf_counter()
            check_mosaic_file(out_path, scene, levels, settings=settings, block_size=spec.block_size)
            timings["check"] = time.perf_counter() - started
            planned = PlannedMosaic("vrt", levels, (gates.SHA256_METADATA_KEY, sha256), nbytes=nbytes)
            started = time.perf_counter()
            outcome = commit_file(
                output,
                mosaic_name,
                out_path,
                sha256=sha256,
                content_type=COG_CONTENT_TYPE,
                job_id=job_id,
                metadata={OVERVIEW_LEVELS_METADATA_KEY: str(levels), METHOD_METADATA_KEY: used},
                expect_etag=expect_etag,
            )
            timings["upload"] = time.perf_counter() - started
            counts = {"sent_from_instance": nbytes}
            os.remove(out_path)

        if outcome is gates.Outcome.SUPERSEDED:
            return superseded()
        if outcome is gates.Outcome.ALREADY_PRESENT:
            return already_present(planned)
        # 6. The committed blob, checked again through /vsiaz/ with the same function, after the
        #    commit because there is no file to check before: the bytes went straight to storage.
        #    The layout was checked before staging, the bytes are a deterministic function of
        #    the tiles (server-side: of the very tile versions the manifest recorded), and the
        #    list committed names only this attempt's blocks. A failure here is a bug (the
        #    writer or the service did not produce what was planned) that repeating would not
        #    fix, so it is raised loudly (MosaicCheckError, not retryable) and the blob is left
        #    in place to be examined; every later assembly verifies it again and fails the same way.
        verify(planned)
        write_sidecars(job_id, scene, **sidecars, replace=replace)
    except CommittedElsewhere:
        if sink is not None:
            sink.abort()
        if replace is not None:
            return superseded()
        logger.info("job %s: another attempt committed the mosaic while this one staged; stopped", job_id)
        return already_present(None)
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    logger.info(
        "job %s: mosaic %s (%s, %d bytes, %d overview levels, %s, %s)",
        job_id,
        outcome,
        used,
        planned.nbytes,
        planned.levels,
        counts,
        {k: round(v, 3) for k, v in timings.items()},
    )
    return MosaicResult(
        outcome=str(outcome),
        nbytes=planned.nbytes,
        overview_levels=planned.levels,
        timings=timings,
        method=used,
        sha256=sha256,
        transfer=counts,
        **names,
    )


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


__all__ = [
    "COG_CONTENT_TYPE",
    "OVERVIEW_LEVELS_METADATA_KEY",
    "MosaicCheckError",
    "MosaicResult",
    "STAGE_IN_FLIGHT",
    "StagedBlockSink",
    "assemble_mosaic",
    "build_mosaic_blocks",
    "build_mosaic_vrt",
    "check_manifest",
    "check_mosaic_file",
    "check_planned_mosaic",
    "commit_file",
    "commit_staged_blob",
    "estimate_vrt_temp_bytes",
    "mosaic_overview_levels",
    "verify_committed_mosaic",
]
