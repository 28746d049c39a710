"""The ``server`` strategy, the default: the storage service builds the mosaic from the tiles' blocks.

The mosaic's full resolution and the overview levels the tiles carry are the tiles' own
compressed blocks in a new TIFF layout (:func:`.block_copy.planned_block_copy`, which checks the
planned head first); the service stages them from byte ranges of the tile blobs (Put Block From
URL, each range pinned to the tile version the manifest recorded: :mod:`.server_copy`,
:mod:`.copy_plan`). Only the head and the coarse levels, computed from the tiles' smallest
reused level, pass through this process.

Given ``shares``, the copied ranges were staged by share activities (:mod:`.shares`): only the
head and coarse levels are staged here, once the plan is found to be the shares' own. Only this
strategy knows of shares; the others and the shared commit never see them.

A service without Put Block From URL raises :class:`~tilecommit.errors.CopyFromUrlUnsupported`
(``auto`` then streams the bytes: :mod:`.blocks_strategy`); tiles that cannot be block-copied
raise :class:`~tilecommit.errors.IncompatibleTilesError` (``auto`` then assembles through a VRT).
"""

from __future__ import annotations

import logging
import time

from .block_copy import planned_block_copy
from .server_copy import ServerSideStager, copy_source_for, ranges_tag
from .shares import StagedShares, check_against_plan, read_share_plan
from .strategy import BuiltMosaic, MosaicJob

logger = logging.getLogger(__name__)


def build(job: MosaicJob, shares: StagedShares | None = None) -> BuiltMosaic:
    """Plan the block-copy mosaic, check its head, and have the service stage it (the copied
    ranges only when no ``shares`` staged them); nothing is committed."""
    tiles = job.stores.tiles
    with planned_block_copy(job) as copy:
        unpinned = [w for w, etag in copy.versions.items() if not etag]
        if unpinned:
            logger.warning(
                "job %s: %d manifest rows (e.g. %s) predate recorded ETags: their tiles are copied unpinned",
                job.job_id,
                len(unpinned),
                unpinned[0],
            )
        layout = copy.layout
        share_plan = read_share_plan(tiles, shares) if shares is not None else None
        if share_plan is not None:
            check_against_plan(share_plan, copy.plan, copy.versions)
        stager = ServerSideStager(
            job.stores.output.get_blob_client(job.mosaic_name),
            tiles,
            uris=copy.uris,
            etags=copy.versions,
            copy_source=copy_source_for(tiles),
            read_local=lambda ref: layout.sources[ref.source].read(ref.offset, ref.length),
            leaders=layout.writer.leaders,
            trailers=layout.writer.trailers,
            committed_elsewhere=job.committed_elsewhere,
            range_tag=share_plan.tag
            if share_plan is not None
            else ranges_tag(job.job_id, copy.plan.ranges, copy.versions),
        )
        started = time.perf_counter()
        block_ids = stager.stage(copy.plan, ranges_staged=share_plan is not None)
        job.timings["write"] = time.perf_counter() - started
    transfer = {
        "copied_by_service": copy.plan.copied_bytes,
        "sent_from_instance": stager.local_bytes_sent,
        "staged_blocks": len(block_ids),
        "copy_ranges": len(copy.plan.ranges),
        "shares": shares.shares if shares is not None else 1,
    }
    return BuiltMosaic(copy.planned, transfer, block_ids=block_ids)
