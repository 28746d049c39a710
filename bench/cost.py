"""What a scene costs: ``python -m bench.cost [--sizes 10240 20480] [--duplicates] [--out cost.json]``.

For each size, one job through the local host on the bench's own Azurite: the job's usage and
estimate as its summary carries them (tilecommit/usage.py, tilecommit/cost.py), the tiles'
bytes, and what keeping them a month would cost. With ``--duplicates`` the same scene again as
a fresh job whose every activity runs twice (at-least-once made visible): the Python SDKs'
requests of both runs, counted at the socket (bench.common.RequestCounter), give what the
duplicates cost; the job's own usage counts each window once (a second completion is dropped
with what it used). Prints a table and writes bench/results/cost.json (or ``--out``); nothing
is asserted.
"""

from __future__ import annotations

import argparse
import json

from .common import RESULTS, BenchStorage, RequestCounter, say, scene_path, table
from .instrumented import local_host, process


def one_job(storage: BenchStorage, size: int, *, duplicates: bool = False) -> dict:
    env = storage.app_env(f"cost-{size}-{duplicates}")
    with local_host(storage, env, duplicate_activities=duplicates) as inst:
        before = inst.requests.snapshot()
        summary = process(inst, scene_path(size))
        state = inst.host.engine.wait_for(summary["job_id"], timeout=600)
        sent = RequestCounter.delta(inst.requests.snapshot(), before)
    output = state["output"]
    return {
        "size": size,
        "duplicates": duplicates,
        "windows": output["windows"],
        "tile_bytes": output["bytes"],
        "cost": output["cost"],
        "sdk_requests": sum(sent.values()),
        "elapsed_s": summary["elapsed_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10240])
    parser.add_argument("--duplicates", action="store_true", help="also run each size with every activity twice")
    parser.add_argument("--out", default="cost.json", help="file name under bench/results/ (default: cost.json)")
    args = parser.parse_args(argv)
    runs = []
    with BenchStorage() as storage:
        for size in args.sizes:
            runs.append(one_job(storage, size))
            if args.duplicates:
                runs.append(one_job(storage, size, duplicates=True))
    rows = []
    for run in runs:
        cost = run["cost"]
        requests = cost["requests"]
        rows.append(
            [
                f"{run['size']}²" + (" x2" if run["duplicates"] else ""),
                run["windows"],
                f"{cost['gb_seconds']:.0f}",
                sum(f["executions"] for f in cost["functions"].values()),
                requests.get("blob.write", 0),
                requests.get("blob.read", 0),
                requests.get("blob.list", 0) + requests.get("blob.other", 0),
                requests.get("table.write", 0) + requests.get("table.read", 0),
                run["sdk_requests"],
                f"{run['tile_bytes'] / 2**30:.2f}",
                f"${cost['usd']:.5f}",
                f"${cost['tiles_per_month']:.5f}",
            ]
        )
    headers = ["scene", "windows", "GB-s", "executions", "blob writes", "reads", "list+other", "table"]
    headers += ["SDK requests (all)", "tiles GiB", "job", "tiles a month"]
    say(table(rows, headers))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
