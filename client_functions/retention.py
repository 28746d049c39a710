"""The retention sweep: finished jobs older than the retention lose their tiles, manifest rows
and Durable history; their mosaic, STAC item and quicklook stay.

Run daily by the timer function in function_app.py and by ``python -m devhost purge``. A job is
swept only when it and every instance of it (its batches, groups and scrubs) have finished:
nothing of a running job is ever deleted. Per job: the rows and tiles first
(:mod:`tilecommit.retention`), then the history of its instances, the job's own last, so a
sweep stopped half-way finds the job again next time and finishes it.

Purging by id, one instance at a time: the extension's purge by filter needs a
``createdTimeFrom`` (HttpApiHandler answers 400 without one) and cannot say "only if every
instance of this job has finished".
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import azure.durable_functions as df
from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from orchestrators import names
from tilecommit import retention
from tilecommit.settings import SETTING_TILE_RETENTION_DAYS

from .job_api import FINISHED, instances

logger = logging.getLogger(__name__)

Status = df.OrchestrationRuntimeStatus


async def sweep_as_configured(
    client: df.DurableOrchestrationClient,
    manifest: TableClient,
    tiles: ContainerClient,
    *,
    retention_days: int,
    older_than_days: float | None = None,
) -> dict:
    """:func:`sweep` with the app's retention (``TILECOMMIT_TILE_RETENTION_DAYS``, where 0 keeps
    everything forever), or with ``older_than_days`` when one is given (``devhost purge --older-than``)."""
    if older_than_days is None and retention_days == 0:
        logger.info("retention: %s=0, tiles are kept forever", SETTING_TILE_RETENTION_DAYS)
        return {"jobs": [], "kept": f"forever ({SETTING_TILE_RETENTION_DAYS}=0)"}
    days = retention_days if older_than_days is None else older_than_days
    return await sweep(client, manifest, tiles, older_than=timedelta(days=days))


async def sweep(
    client: df.DurableOrchestrationClient,
    manifest: TableClient,
    tiles: ContainerClient,
    *,
    older_than: timedelta,
    now: datetime | None = None,
) -> dict:
    """Purge every job finished more than ``older_than`` ago; what was purged and what was kept."""
    cutoff = (now or datetime.now(UTC)) - older_than
    finished = ",".join(s.value for s in FINISHED)
    report = {"jobs": [], "rows": 0, "tiles": 0, "instances": 0, "kept_running": []}
    for job in await instances(client, runtimeStatus=finished):
        if job.name != names.TILE_SCENE or job.last_updated_time is None or job.last_updated_time > cutoff:
            continue
        family = await instances(client, instanceIdPrefix=f"{job.instance_id}-")
        running = [i.instance_id for i in family if i.runtime_status not in FINISHED]
        if running:
            # A failed job's other batches, or a scrub, still run: the job is not finished yet.
            report["kept_running"].append(job.instance_id)
            continue
        purged = await asyncio.to_thread(retention.purge_job_storage, manifest, tiles, job.instance_id)
        for instance in [*family, job]:
            result = await client.purge_instance_history(instance.instance_id)
            report["instances"] += result.instances_deleted
        report["jobs"].append(job.instance_id)
        report["rows"] += purged.rows
        report["tiles"] += purged.tiles
        logger.info(
            "retention: job %s (%s %s) purged: %d rows, %d tiles, %d instances",
            job.instance_id,
            job.runtime_status.value,
            job.last_updated_time.isoformat(),
            purged.rows,
            purged.tiles,
            len(family) + 1,
        )
    return report
