"""``python -m devhost backfill``: the blobs already in the input container, each started as a
job as its upload event would start it, through a running local host.

The command starts (or finds) the backfill with the function ``POST /api/backfill`` calls
(:func:`client_functions.backfill.start_backfill`), through the real Durable client, prints its
progress on stderr while this host runs it and its jobs, and its final view as JSON on stdout.
Run again with the same arguments it finds the same backfill: it reports a running or completed
one and resumes a failed or cancelled one from its checkpoint.
"""

from __future__ import annotations

import json
import sys
import time

from .durable.functions import EventLoopThread

#: Seconds between two progress lines.
PROGRESS_EVERY_S = 1.0


def progress_line(view: dict) -> str:
    counts = view.get("counts") or {}
    shown = ", ".join(f"{key} {value}" for key, value in counts.items())
    return f"backfill {view['id']}: {view['state']}, {view.get('stage')}, page {view.get('pages')}: {shown}"


def run_backfill(host, values: dict, *, timeout: float, out=sys.stderr) -> dict:
    """Start or find the backfill of ``values`` on ``host`` (started, watcher off); wait until it
    ends or ``timeout`` passes, printing its progress; its last view, with what this run did
    (``action``: started, resumed, running, completed)."""
    import azure.durable_functions as df

    from client_functions import backfill

    run = EventLoopThread.shared().run
    client = df.DurableOrchestrationClient(host.api.client_binding())
    request = backfill.request_from(values, host.settings.input_container)
    uploads = host.blobs.get_container_client(host.settings.input_container)
    view = run(backfill.start_backfill(client, request, uploads))
    action = view["action"]
    print(f"backfill {view['id']}: {action}", file=out, flush=True)
    deadline = time.monotonic() + timeout
    while view["state"] in ("pending", "running") and time.monotonic() < deadline:
        time.sleep(PROGRESS_EVERY_S)
        view = run(backfill.get_backfill(client, view["id"]))
        print(progress_line(view), file=out, flush=True)
    return {**view, "action": action}


def print_result(view: dict) -> bool:
    """Print the view as JSON; whether the backfill completed with no failed start."""
    print(json.dumps(view))
    return view["state"] == "completed" and not (view.get("counts") or {}).get("failed")
