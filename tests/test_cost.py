"""What a job used and its cost: the requests the app counts against what Azurite served (its
own request log), the estimate from the price table, and where the cost shows (the job's
summary, its completion event, the job API)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from devhost.azurite import Azurite
from devhost.session import process_file
from testkit.strict_storage import StrictStorage
from tilecommit import cost, jobs, usage

from .app_jobs import local_host, make_scene
from .conftest import app_env_for

pytestmark = pytest.mark.slow

#: One line per request Azurite served: its service, method and URL.
SERVED = re.compile(r"info: (Blob|Table)StorageContextMiddleware: RequestMethod=(\w+) RequestURL=(\S+)")


def served_requests(log: Path, start: int, app_env) -> Counter:
    """What Azurite served from byte ``start`` of its log, to the test's data containers and
    manifest table, as (service, kind). Left out, because no activity of the job makes them: the
    upload itself, the watcher's listings of the input container (Event Grid's part, locally), the starter's HEAD of
    the upload (the blob-triggered function), the host creating its containers, and Azurite's own
    GETs of a Put Block From URL's source (the service copying within the account, billed as the
    one write; Azurite does it over HTTP, as axios)."""
    containers = {app_env.input, app_env.tiles, app_env.output}
    served: Counter = Counter()
    with log.open("rb") as text:
        text.seek(start)
        for line in text.read().decode(errors="replace").splitlines():
            match = SERVED.search(line)
            if not match:
                continue
            if '"user-agent":"axios/' in line:
                continue  # Azurite fetching a Put Block From URL's source from itself: no request of ours
            service, method, url = match.group(1).lower(), match.group(2), match.group(3)
            path = url.split("?", 1)[0].split("/")
            if service == "blob":
                if len(path) < 5 or path[4] not in containers:
                    continue
                kind = usage.blob_kind(method, url)
                if (
                    path[4] == app_env.input
                    and method in ("PUT", "HEAD")
                    or kind == "list"
                    and path[4] == app_env.input
                ):
                    continue  # the upload itself, the starter's HEAD of it, the watcher's listings
                if method == "PUT" and kind == "list":
                    continue  # the host creating its containers (the infrastructure's job in Azure)
            else:
                if len(path) < 5 or not path[4].startswith(app_env.manifest):
                    continue
                kind = usage.table_kind(method)
            served[f"{service}.{kind}"] += 1
    return served


def test_the_requests_a_job_counts_are_the_requests_azurite_served(tmp_path, monkeypatch):
    log = tmp_path / "azurite-debug.log"
    scene = make_scene(tmp_path / "scene.tif", 2048, 1536)  # 8 x 6 windows of 256
    with Azurite(debug_log=str(log)) as emulator, StrictStorage(emulator) as azurite:
        app_env = app_env_for(azurite, monkeypatch, "test_cost::served")
        with local_host(app_env) as host:
            host.ensure_storage()
            start = log.stat().st_size
            summary = process_file(host, scene, timeout=300)
            state = host.engine.wait_for(summary["job_id"], timeout=60)
        served = served_requests(log, start, app_env)
        blobs = BlobServiceClient.from_connection_string(azurite.connection_string)
        item = json.loads(
            blobs.get_blob_client(app_env.output, jobs.stac_blob_name(summary["job_id"])).download_blob().readall()
        )
    counted = Counter({k: v for k, v in state["output"]["usage"]["requests"].items() if v})
    total_served, total_counted = sum(served.values()), sum(counted.values())
    print(f"requests: counted {dict(counted)} ({total_counted}), served {dict(served)} ({total_served})")
    assert summary["status"] == "completed" and total_served > 48 * 3
    assert abs(total_counted - total_served) <= 0.02 * total_served, (counted, served)
    for key in set(counted) | set(served):
        assert abs(counted[key] - served[key]) <= max(2, 0.02 * served[key]), (key, counted, served)

    # The STAC item records the cost until it was made: everything before the assembly, and the
    # assembly until then, so a little less than the job's (the rest of the assembly, the event).
    in_item, job_cost = item["properties"]["tilecommit:cost"], state["output"]["cost"]
    print(f"cost: item ${in_item['usd']:.8f} ({in_item['gb_seconds']} GB-s), job ${job_cost['usd']:.8f}")
    # 2048 x 1536 in windows of 256 has coarse levels above the tiles': the reduction tree runs.
    assert set(in_item["functions"]) == {"validate_source", "render_tile", "reduce_level_node", "assemble_mosaic"}
    assert in_item["functions"]["reduce_level_node"] == job_cost["functions"]["reduce_level_node"]
    assert in_item["functions"]["render_tile"] == job_cost["functions"]["render_tile"]
    assembly_in_item = in_item["functions"]["assemble_mosaic"]["seconds"]
    assert 0 < assembly_in_item <= job_cost["functions"]["assemble_mosaic"]["seconds"]
    assert 0 < in_item["usd"] <= job_cost["usd"]
    for key, n in in_item["requests"].items():
        assert n <= job_cost["requests"][key], key


def test_the_estimate_prices_each_item_from_the_table_and_says_what_it_leaves_out():
    used = {
        "functions": {
            "render_tile": {"executions": 10, "seconds": 5.0},
            "assemble_mosaic": {"executions": 1, "seconds": 2.0},
        },
        "requests": {"blob.write": 100, "blob.read": 40, "table.write": 10, "table.read": 10},
        "bytes_sent": 1000,
        "bytes_received": 2000,
    }
    prices = cost.price_table()
    estimate = cost.estimate(used, instance_memory_mb=2048, tile_bytes=2**30)
    assert estimate["gb_seconds"] == 14.0  # 7 s at 2 GB
    assert estimate["functions"]["render_tile"] == {"executions": 10, "seconds": 5.0, "gb_seconds": 10.0}
    assert estimate["items"]["blob_writes"] == pytest.approx(100 * prices["blob_write"]["usd"])
    assert estimate["items"]["table_transactions"] == pytest.approx(20 * prices["table_transaction"]["usd"])
    assert estimate["items"]["compute"] == pytest.approx(14.0 * prices["flex_gb_second"]["usd"])
    assert estimate["usd"] == pytest.approx(sum(estimate["items"].values()))
    assert estimate["tiles_per_month"] == pytest.approx(prices["blob_gb_month"]["usd"])
    assert estimate["unverified_prices"] == sorted(
        n for n, p in prices.items() if isinstance(p, dict) and not p["verified"]
    )
    for name, price in prices.items():
        if isinstance(price, dict):
            assert price["source"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", price["date"]), name
    json.dumps(estimate)  # it goes into histories, events and API answers as it is
