"""A job's price estimate, from what it used (:mod:`tilecommit.usage`) and the price table beside
this module (``prices.toml``: each price with its unit, source and date).

Compute is estimated as each activity's seconds times the instance's memory, in GB-seconds.
Flex Consumption bills an instance's memory while it runs at least one execution, so several
activities at once on one instance are billed once: the figure is an upper bound, reached when
each activity has an instance to itself. Orchestrator episodes and the host's own task-hub
requests are not counted (the app cannot see them); the estimate says so in ``excluded``.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

from . import usage

PRICE_TABLE = Path(__file__).with_name("prices.toml")
#: What the estimate leaves out, said with every estimate.
EXCLUDED = (
    "orchestrator executions and the task hub's queue and table transactions (the host's, not the app's)",
    "the completion event's own publish (one execution, after the estimate is made)",
    "attempts that raised (a fault retried): their requests are billed but their usage is lost with them",
    "storage over time: tiles_per_month prices keeping the tiles for a month",
)


@cache
def price_table(path: Path = PRICE_TABLE) -> dict:
    with path.open("rb") as table:
        return tomllib.load(table)


def estimate(used: dict | None, *, instance_memory_mb: int, tile_bytes: int = 0, prices: dict | None = None) -> dict:
    """The job's estimate in the price table's currency, item by item, with what each item counts."""
    prices = prices or price_table()
    used = usage.add(usage.empty(), used)
    memory_gb = instance_memory_mb / 1024
    functions = {
        name: {**f, "gb_seconds": round(f["seconds"] * memory_gb, 3)} for name, f in sorted(used["functions"].items())
    }
    gb_seconds = sum(f["gb_seconds"] for f in functions.values())
    executions = sum(f["executions"] for f in functions.values())
    requests = used["requests"]
    table = requests["table.write"] + requests["table.read"]

    def usd(name: str, quantity: float) -> float:
        return quantity * prices[name]["usd"]

    items = {
        "compute": usd("flex_gb_second", gb_seconds),
        "executions": usd("flex_execution", executions),
        "blob_writes": usd("blob_write", requests["blob.write"]),
        "blob_reads": usd("blob_read", requests["blob.read"]),
        "blob_lists": usd("blob_list", requests["blob.list"]),
        "blob_other": usd("blob_other", requests["blob.other"]),
        "table_transactions": usd("table_transaction", table),
    }
    used_prices = ["flex_gb_second", "flex_execution", "blob_write", "blob_read", "blob_list", "blob_other"]
    return {
        "currency": prices["currency"],
        "usd": round(sum(items.values()), 8),
        "items": {name: round(value, 8) for name, value in items.items()},
        "tiles_per_month": round(usd("blob_gb_month", tile_bytes / 2**30), 8),
        "functions": functions,
        "gb_seconds": round(gb_seconds, 3),
        "instance_memory_mb": instance_memory_mb,
        "requests": requests,
        "bytes_sent": used["bytes_sent"],
        "bytes_received": used["bytes_received"],
        "prices": f"tilecommit/prices.toml ({prices['region']})",
        "unverified_prices": sorted(
            n for n in [*used_prices, "table_transaction", "blob_gb_month"] if not prices[n].get("verified")
        ),
        "excluded": list(EXCLUDED),
    }


def estimate_so_far(before: dict | None, *, instance_memory_mb: int, tile_bytes: int = 0) -> dict:
    """The estimate of what the job used until now: ``before`` (what its activities that ended
    used, as the orchestration added it up) plus the running activity's own usage so far
    (:func:`tilecommit.usage.so_far`). What the job does after it is made is left out, and said."""
    used = usage.add(usage.add(usage.empty(), before), usage.so_far())
    made = estimate(used, instance_memory_mb=instance_memory_mb, tile_bytes=tile_bytes)
    made["excluded"].append("what the job did after this estimate was made (the rest of the activity that made it)")
    return made
