"""The ``blocks`` strategy: the block-copy mosaic, its bytes streamed through this process.

The same file the ``server`` strategy makes (:mod:`.block_copy`), but its blocks are read from
the tiles (ranged reads: :mod:`.block_sources`) and written front to back into staged blocks of
the output blob (Put Block: :class:`.staging.StagedBlockSink`), once its planned head passed the
checks. ``auto`` uses it when the service does not implement Put Block From URL (an emulator
older than Azurite 3.37 answers 501); the benchmark asks for it. Tiles that cannot be
block-copied raise :class:`~tilecommit.errors.IncompatibleTilesError`, which sends ``auto`` to
the VRT.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ... import gates
from ...usage import ContextExecutor
from .. import tiff
from .block_copy import prepare_block_copy
from .block_sources import FETCH_THREADS
from .checks import check_planned_mosaic
from .staging import StagedBlockSink
from .strategy import BuiltMosaic, MosaicJob, PlannedMosaic


def build(job: MosaicJob) -> BuiltMosaic:
    """Stream the mosaic into staged blocks of its blob, its planned head checked first; nothing
    is committed. On any failure the stream is aborted: no block of it is left in flight."""
    sink = StagedBlockSink(
        job.stores.output.get_blob_client(job.mosaic_name), committed_elsewhere=job.committed_elsewhere
    )
    planned_head: list[bytes] = []

    def check_head(head: bytes, planned_levels: int) -> None:
        check_planned_mosaic(
            head,
            job.scene,
            planned_levels,
            settings=job.stores.settings,
            job_id=job.job_id,
            block_size=job.spec.block_size,
            shorter_side=job.spec.choice.web_optimized,
        )
        planned_head.append(head)

    try:
        written, levels = build_mosaic_blocks(job, sink, check_head=check_head)
        block_ids = sink.close()
    except BaseException:
        sink.abort()
        raise
    if sink.nbytes != written.nbytes:
        raise AssertionError(f"streamed {sink.nbytes} bytes, the writer wrote {written.nbytes}")
    planned = PlannedMosaic(
        "blocks", levels, (gates.SHA256_METADATA_KEY, written.sha256), nbytes=written.nbytes, head=planned_head[0]
    )
    transfer = {"sent_from_instance": written.nbytes, "staged_blocks": len(block_ids)}
    return BuiltMosaic(planned, transfer, sha256=written.sha256, block_ids=block_ids)


def build_mosaic_blocks(
    job: MosaicJob,
    out: tiff.Writable,
    *,
    check_head: Callable[[bytes, int], None] | None = None,
) -> tuple[tiff.WrittenTiff, int]:
    """Lay the mosaic out from the tiles' directories and write it, front to back, into ``out``.

    ``out`` needs only ``write``: a :class:`.staging.StagedBlockSink` (the bytes pass through this
    process into the output blob) or a local file. ``check_head(head, levels)`` sees the planned
    header and directories before the first byte goes to ``out``; it raises to stop the build.
    """
    timings = job.timings
    with ContextExecutor(max_workers=FETCH_THREADS, thread_name_prefix="tilefetch") as executor:
        layout = prepare_block_copy(job, executor)
        try:
            if check_head is not None:
                started = time.perf_counter()
                head, _ = layout.writer.head(layout.directories)
                check_head(head, layout.levels)
                timings["check"] = time.perf_counter() - started
            started = time.perf_counter()
            written = layout.writer.write(out, layout.directories, layout.fetch)
            timings["write"] = time.perf_counter() - started
        finally:
            layout.close()
    return written, layout.levels
