"""The retention sweep: finished jobs older than the retention lose their tiles, manifest rows,
mosaic staging plans and Durable history; their mosaic, STAC item and quicklook stay.

Run daily by the timer function in function_app.py and by ``python -m devhost purge``. A job is
swept only when it and every instance of it (its batches, groups and scrubs) have finished:
nothing of a running job is ever deleted. Per job (:func:`sweep_job`):

1. the job's cancellation row (:func:`tilecommit.retention.mark_sweeping`): from now on a run of
   the job renders nothing it has no row for, and the job API and the starter refuse to start
   it again (``job-being-swept``);
2. the job looked at again: a restart that got in before the row (its status is no longer the
   finished one listed) keeps the job, and the row goes;
3. its rows, then its tiles and plans (:mod:`tilecommit.retention`);
4. looked at once more: a restart that got in between its own check of the row and its start
   renders nothing (the row is there), and keeps the job's history; else the history of its
   instances, the job's own last;
5. the row, last.

So a restart racing a sweep never has its tiles deleted under it, nor its history, and a sweep
stopped half-way finds the job again next time and finishes it.

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
from azure.durable_functions.models.DurableOrchestrationStatus import DurableOrchestrationStatus
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
    report = {
        "jobs": [],
        "rows": 0,
        "tiles": 0,
        "plans": 0,
        "levels": 0,
        "instances": 0,
        "kept_running": [],
        "kept_restarted": [],
    }
    for job in await instances(client, runtimeStatus=finished):
        if job.name != names.TILE_SCENE or job.last_updated_time is None or job.last_updated_time > cutoff:
            continue
        await sweep_job(client, manifest, tiles, job, report)
    return report


async def _still_as_listed(client: df.DurableOrchestrationClient, job: DurableOrchestrationStatus) -> bool:
    """The job is still the finished run the sweep listed: no restart has begun since."""
    now = await client.get_status(job.instance_id)
    return now.runtime_status in FINISHED and now.last_updated_time == job.last_updated_time


async def sweep_job(
    client: df.DurableOrchestrationClient,
    manifest: TableClient,
    tiles: ContainerClient,
    job: DurableOrchestrationStatus,
    report: dict,
) -> None:
    """Sweep one finished job, in the steps the module's docstring gives; ``report`` gains it."""
    job_id = job.instance_id
    family = await instances(client, instanceIdPrefix=f"{job_id}-")
    if any(i.runtime_status not in FINISHED for i in family):
        # A failed job's other batches, or a scrub, still run: the job is not finished yet.
        report["kept_running"].append(job_id)
        return
    await asyncio.to_thread(retention.mark_sweeping, manifest, job_id)
    if not await _still_as_listed(client, job):
        await asyncio.to_thread(retention.unmark_sweeping, manifest, job_id)
        report["kept_restarted"].append(job_id)
        logger.info("retention: job %s was started again before its sweep: kept", job_id)
        return
    purged = await asyncio.to_thread(retention.purge_job_storage, manifest, tiles, job_id)
    report["rows"] += purged.rows
    report["tiles"] += purged.tiles
    report["plans"] += purged.plans
    report["levels"] += purged.levels
    if not await _still_as_listed(client, job):
        # Started between its own look at the row and its start: it renders nothing while the
        # row is there, so nothing it wrote was deleted; once the row goes it renders anew.
        await asyncio.to_thread(retention.unmark_sweeping, manifest, job_id)
        report["kept_restarted"].append(job_id)
        logger.warning("retention: job %s was started again while its tiles were deleted: its history is kept", job_id)
        return
    for instance in [*family, job]:
        result = await client.purge_instance_history(instance.instance_id)
        report["instances"] += result.instances_deleted
    await asyncio.to_thread(retention.clear_marker, manifest, job_id)
    report["jobs"].append(job_id)
    logger.info(
        "retention: job %s (%s %s) purged: %d rows, %d tiles, %d plans, %d level intermediates, %d instances",
        job_id,
        job.runtime_status.value,
        job.last_updated_time.isoformat(),
        purged.rows,
        purged.tiles,
        purged.plans,
        purged.levels,
        len(family) + 1,
    )
