"""``python -m devhost verify``: a scrub of a finished job through a running local host.

The local host serves no HTTP functions (only the Durable extension's own API), so the command
starts ``verify_scene`` with the same start function the app's HTTP route calls
(:func:`client_functions.verify_start.start_verify`), through the real Durable client.
"""

from __future__ import annotations

import time

from .durable.functions import EventLoopThread


def verify_job(host, job_id: str, *, repair: bool, timeout: float = 3600) -> dict:
    """Start a scrub (a repair with ``repair``) of ``job_id``, wait for it; its summary as a dict."""
    import azure.durable_functions as df

    from client_functions import verify_start

    started = time.perf_counter()
    client = df.DurableOrchestrationClient(host.api.client_binding())
    # A job that is not there or still running raises tilecommit.errors.JobNotVerifiable.
    instance_id = EventLoopThread.shared().run(verify_start.start_verify(client, job_id, repair=repair))
    state = host.engine.wait_for(instance_id, timeout=timeout)
    return verify_summary(state, elapsed=time.perf_counter() - started)


def verify_summary(state: dict, *, elapsed: float | None = None) -> dict:
    """What ``verify`` prints: the orchestration's output, or its error."""
    if state["status"] != "Completed":
        summary = {"verify_id": state["id"], "status": state["status"].lower()}
        summary["error"] = state.get("error") or f"verify is {state['status']}"
    else:
        summary = {"status": "completed", **state["output"]}
    if elapsed is not None:
        summary["elapsed_s"] = round(elapsed, 3)
    return summary
