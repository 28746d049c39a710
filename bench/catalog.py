"""Publication to pgstac: one item at a time, then many at once, each delivered twice.

    python -m bench.catalog [--items 32] [--deliveries 2]

A private Azurite and a private PostgreSQL with PostGIS and pgstac (testkit/postgres.py), both on
127.0.0.1. One small scene is processed by the local host (no catalog), and its committed STAC
item is written again under ``items`` further job ids, each moved east and a month later than
the last (so every insert widens pgstac's partition constraint). Then:

- one at a time: each item published once into a fresh collection (the wall of each call);
- at once: ``items`` x ``deliveries`` threads, released together, each publishing its job's item
  into another fresh collection.

Printed: the wall of a publication (median and range), the wall of the whole burst, its outcomes
(written / already-present), the resends of a busy answer (a deadlock, pgstac's partition race)
and the extent resends, counted from the protocol's own log lines, and the rows each collection
ends with (0 lost, 0 doubled). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

from .common import fmt_spread, load1, say, spread, table, tiny_scene


class _Resends(logging.Handler):
    """Counts the protocol's warnings that it sends a request again."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "sending the same conditional request again" in message:
            self.counts["insert"] += 1
        elif "updating the extent" in message and "trying again" in message:
            self.counts["extent"] += 1


def _moved(coordinates: list, dx: float) -> list:
    """GeoJSON coordinates (nested lists of [x, y]) moved east by ``dx``."""
    if isinstance(coordinates[0], list):
        return [_moved(c, dx) for c in coordinates]
    return [coordinates[0] + dx, *coordinates[1:]]


def _items(host, summary: dict, count: int) -> tuple[object, list[str]]:
    """The output container and ``count`` job ids, each holding the real item moved and re-dated."""
    from tilecommit import jobs

    output = host.blobs.get_container_client(host.settings.output_container)
    item = json.loads(output.get_blob_client(jobs.stac_blob_name(summary["job_id"])).download_blob().readall())
    base = datetime.fromisoformat(item["properties"]["datetime"].replace("Z", "+00:00"))
    ids = [f"{n:016x}" for n in range(0xB000, 0xB000 + count)]
    for n, job_id in enumerate(ids):
        moved = json.loads(json.dumps(item))
        moved["id"] = job_id
        moved["properties"]["datetime"] = (base + timedelta(days=30 * n)).isoformat().replace("+00:00", "Z")
        moved["bbox"] = [v + 0.01 * n if i % 2 == 0 else v for i, v in enumerate(item["bbox"])]
        moved["geometry"]["coordinates"] = _moved(item["geometry"]["coordinates"], 0.01 * n)
        output.get_blob_client(jobs.stac_blob_name(job_id)).upload_blob(json.dumps(moved).encode(), overwrite=True)
    return output, ids


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.catalog")
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--deliveries", type=int, default=2)
    args = parser.parse_args()

    import psycopg

    from devhost.azurite import Azurite
    from devhost.durable.host import HostOptions, LocalHost
    from devhost.session import process_file
    from testkit.postgres import LocalPostgres
    from tilecommit.catalog import pgstac
    from tilecommit.settings import SETTING_WINDOW_SIZE, STORAGE_CONNECTION, Settings

    resends = _Resends()
    logging.getLogger("tilecommit").addHandler(resends)
    with tempfile.TemporaryDirectory() as folder, Azurite() as azurite, LocalPostgres() as database:
        os.environ[STORAGE_CONNECTION] = azurite.connection_string
        os.environ[SETTING_WINDOW_SIZE] = "256"
        with LocalHost(HostOptions()) as host:
            summary = process_file(host, tiny_scene(Path(folder) / "scene.tif", 512), timeout=600)
            output, ids = _items(host, summary, args.items)
        settings = Settings.from_env(database.settings())

        say(f"one at a time: {len(ids)} publications (load {load1()})")
        walls = []
        for job_id in ids:
            started = time.perf_counter()
            pgstac.publish_item(job_id, output, settings, collection="one-at-a-time")
            walls.append(time.perf_counter() - started)

        say(f"at once: {len(ids)} x {args.deliveries} deliveries (load {load1()})")
        outcomes: Counter = Counter()
        barrier = threading.Barrier(len(ids) * args.deliveries)

        def deliver(job_id: str) -> None:
            barrier.wait()
            try:
                outcomes[pgstac.publish_item(job_id, output, settings, collection="at-once").outcome] += 1
            except Exception as exc:  # noqa: BLE001 - a bench reports what happened
                outcomes[type(exc).__name__] += 1

        burst_resends = Counter(resends.counts)
        threads = [threading.Thread(target=deliver, args=(job_id,)) for job_id in ids * args.deliveries]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        burst = time.perf_counter() - started
        burst_resends = Counter({k: resends.counts[k] - burst_resends[k] for k in ("insert", "extent")})
        with psycopg.connect(database.dsn()) as conn:
            rows = dict(conn.execute("SELECT collection, count(*) FROM pgstac.items GROUP BY 1").fetchall())
    print(
        table(
            [
                [
                    "one at a time",
                    len(ids),
                    fmt_spread(spread(walls), " s", 3),
                    "-",
                    "written",
                    "-",
                    rows.get("one-at-a-time"),
                ],
                [
                    "at once",
                    f"{len(ids)} x {args.deliveries}",
                    "-",
                    f"{burst:.2f} s",
                    " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
                    f"insert {burst_resends['insert']}, extent {burst_resends['extent']}",
                    rows.get("at-once"),
                ],
            ],
            ["publications", "items", "wall of one", "wall of all", "outcomes", "resends", "rows"],
        )
    )


if __name__ == "__main__":
    main()
