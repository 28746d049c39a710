"""Starting a scrub of a finished job, the same way from the CLI and from the HTTP route."""

from __future__ import annotations

import json
import logging
import secrets

import azure.durable_functions as df

from orchestrators import names
from tilecommit.errors import JobNotVerifiable

logger = logging.getLogger(__name__)


#: A finished job can be verified: a completed one, and a failed one too (a mosaic known bad
#: fails its job, and the message sends the operator here to repair it).
VERIFIABLE = {
    df.OrchestrationRuntimeStatus.Completed,
    df.OrchestrationRuntimeStatus.Failed,
    df.OrchestrationRuntimeStatus.Terminated,
}


def verify_instance_id(job_id: str) -> str:
    """A new id for each scrub (two may run at once: each is its own instance)."""
    return f"{job_id}-verify-{secrets.token_hex(4)}"


async def start_verify(client: df.DurableOrchestrationClient, job_id: str, *, repair: bool) -> str:
    """Start ``verify_scene`` for the finished job ``job_id`` with the job's own input; its id."""
    status = await client.get_status(job_id)
    runtime = getattr(status, "runtime_status", None)
    if runtime is None:
        raise JobNotVerifiable(f"no job {job_id}")
    if runtime not in VERIFIABLE:
        raise JobNotVerifiable(f"job {job_id} is {runtime.value}: wait until it has finished, then verify it")
    job = status.input_
    job = json.loads(job) if isinstance(job, str) else job
    instance_id = verify_instance_id(job_id)
    await client.start_new(names.VERIFY_SCENE, instance_id, {"job": job, "repair": repair})
    logger.info("started %s of job %s as %s", "repair" if repair else "verify", job_id, instance_id)
    return instance_id
