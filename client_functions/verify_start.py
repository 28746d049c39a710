"""Starting a scrub of a finished job, the same way from the CLI and from the HTTP route, and
what the job API says about a scrub."""

from __future__ import annotations

import json
import logging
import re
import secrets

import azure.durable_functions as df

from orchestrators import names
from tilecommit.errors import JobApiError, JobNotVerifiable

from .job_api import job_status

logger = logging.getLogger(__name__)


#: A finished job can be verified: a completed one, and a failed one too (a mosaic known bad
#: fails its job, and the message sends the operator here to repair it).
VERIFIABLE = {
    df.OrchestrationRuntimeStatus.Completed,
    df.OrchestrationRuntimeStatus.Failed,
    df.OrchestrationRuntimeStatus.Terminated,
}
#: A scrub's id: its job's, ``-verify-`` and 8 random hex characters.
VERIFY_ID = re.compile(r"(?P<job>[0-9a-f]{16})-verify-[0-9a-f]{8}")


def verify_instance_id(job_id: str) -> str:
    """A new id for each scrub (two may run at once: each is its own instance)."""
    return f"{job_id}-verify-{secrets.token_hex(4)}"


async def start_verify(client: df.DurableOrchestrationClient, job_id: str, *, repair: bool) -> str:
    """Start ``verify_scene`` for the finished job ``job_id`` with the job's own input; its id.

    Only a job is verified: an id that is not a job's, or names a batch, a group or a scrub, is
    refused like an unknown one (the job API's own check, :func:`client_functions.job_api.job_status`).
    """
    try:
        status = await job_status(client, job_id)
    except JobApiError as exc:
        raise JobNotVerifiable(exc.message) from None
    runtime = status.runtime_status
    if runtime not in VERIFIABLE:
        raise JobNotVerifiable(f"job {job_id} is {runtime.value}: wait until it has finished, then verify it")
    job = status.input_
    job = json.loads(job) if isinstance(job, str) else job
    instance_id = verify_instance_id(job_id)
    await client.start_new(names.VERIFY_SCENE, instance_id, {"job": job, "repair": repair})
    logger.info("started %s of job %s as %s", "repair" if repair else "verify", job_id, instance_id)
    return instance_id


async def verify_view(client: df.DurableOrchestrationClient, job_id: str, verify_id: str) -> dict:
    """What the job API says about one scrub of ``job_id``: its state and, once it has ended, its
    report (``verify_scene``'s output) or its error. 404 unless ``verify_id`` is a scrub of that job."""
    status = None
    named = VERIFY_ID.fullmatch(verify_id)
    if named and named["job"] == job_id:
        status = await client.get_status(verify_id)
    if not status or status.name != names.VERIFY_SCENE:
        raise JobApiError(404, "verify-not-found", f"no scrub {verify_id} of job {job_id}")
    runtime = status.runtime_status
    ended = runtime in VERIFIABLE
    return {
        "id": verify_id,
        "job_id": job_id,
        "state": runtime.value.lower(),
        "created": status.created_time.isoformat() if status.created_time else None,
        "updated": status.last_updated_time.isoformat() if status.last_updated_time else None,
        "report": status.output if runtime == df.OrchestrationRuntimeStatus.Completed else None,
        "error": status.output if ended and runtime != df.OrchestrationRuntimeStatus.Completed else None,
    }
