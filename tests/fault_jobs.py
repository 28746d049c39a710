"""Whole jobs on the local host with the app's storage traffic (SDK clients and GDAL's /vsiaz/
reads) going through the fault-injecting proxy (testkit/storage_proxy.py)."""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from devhost.durable.host import HostOptions, LocalHost
from devhost.session import process_file
from testkit.storage_proxy import FaultPlan, FaultProxy
from tilecommit import settings as setting_names

from .app_jobs import AppEnv


def app_storage(app_env: AppEnv):
    """The proxy's selector: requests to the app's containers and manifest table only."""
    mine = (app_env.input, app_env.tiles, app_env.output, app_env.manifest)

    def applies(method: str, path: str) -> bool:
        if "comp=list" in path:
            return False
        segments = path.split("?", 1)[0].split("/")
        first = segments[2] if len(segments) > 2 else ""
        return any(first == name or first.startswith(name + "(") for name in mine)

    return applies


@contextmanager
def app_behind_proxy(azurite, monkeypatch, plan: FaultPlan):
    """Blob and table proxies sharing ``plan``; the app's connection setting points at them."""
    with (
        FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as blobs,
        FaultProxy(f"http://127.0.0.1:{azurite.table_port}", plan) as tables,
    ):
        connection = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{blobs.port}/").replace(
            f":{azurite.table_port}/", f":{tables.port}/"
        )
        monkeypatch.setenv(setting_names.STORAGE_CONNECTION, connection)
        yield blobs, tables


def run_job(
    app_env: AppEnv,
    azurite,
    monkeypatch,
    scene: Path,
    name: str,
    plan: FaultPlan,
    *,
    timer_scale: float,
    during=None,
    inspect=None,
):
    """One job of ``scene`` uploaded as ``name``; the summary, the proxies and the attempts per activity.

    ``during(blobs)`` runs in a thread while the job runs; ``inspect(host)`` after it, before the
    host stops."""
    with app_behind_proxy(azurite, monkeypatch, plan) as (blobs, tables):
        host = LocalHost(HostOptions(hub=app_env.hub, timer_scale=timer_scale, watch_interval=0.1))
        host.start()
        watcher = threading.Thread(target=during, args=(blobs,), daemon=True) if during else None
        if watcher:
            watcher.start()
        try:
            summary = process_file(host, scene, name=name, timeout=300)
            if inspect:
                inspect(host)
        finally:
            host.stop()
        mine = [e for e in host.engine.executions if e.instance_id.startswith(summary["job_id"])]
        attempts = Counter(e.name for e in mine)
        failed = Counter(e.name for e in mine if e.error)
    monkeypatch.setenv(setting_names.STORAGE_CONNECTION, azurite.connection_string)
    return summary, blobs, tables, attempts, failed
