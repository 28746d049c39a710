"""Output identity: the sha256 of every tile, the mosaic and the quicklook of one fixed scene,
compared with digests recorded before a change. Speed work must not change one output byte.

    python -m bench.identity record [--size 4096]   # write bench/results/identity_{size}.json
    python -m bench.identity check  [--size 4096]   # run again, compare, exit 1 on any difference

One job of ``python -m devhost process`` on the bench's deterministic scene (``scene_path``) in a
private Azurite; tiles are keyed by window id (the job id differs with the upload's ETag).
The STAC item names the job and its URLs, so it is not compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

from .common import RESULTS, BenchStorage, Context, say, scene_path
from .e2e import pipeline


def output_digests(ctx: Context, size: int) -> dict[str, str]:
    """One job on the size² scene; ``{"tile <window>": sha256, "mosaic": ..., "quicklook": ...}``."""
    from tilecommit import settings as names

    env = ctx.storage.app_env(f"identity-{size}")
    ours = pipeline(ctx, scene_path(size), env)
    blobs = ctx.storage.connection.blob_service()
    job = ours["job_id"]
    digests: dict[str, str] = {}
    tiles = blobs.get_container_client(env[names.SETTING_TILES_CONTAINER])
    for item in tiles.list_blobs(name_starts_with=f"tiles/{job}/"):
        body = tiles.download_blob(item.name).readall()
        digests[f"tile {item.name.rsplit('/', 1)[-1]}"] = hashlib.sha256(body).hexdigest()
    output = blobs.get_container_client(env[names.SETTING_OUTPUT_CONTAINER])
    for kind, name in (("mosaic", "mosaic.tif"), ("quicklook", "quicklook.png")):
        body = output.download_blob(f"mosaics/{job}/{name}").readall()
        digests[kind] = hashlib.sha256(body).hexdigest()
    ctx.storage.drop(env)
    return digests


def compare(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """Every output whose digest differs, is missing or is new."""
    return [
        f"{key}: {recorded.get(key, 'absent')} -> {now.get(key, 'absent')}"
        for key in sorted(set(recorded) | set(now))
        if recorded.get(key) != now.get(key)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.identity", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args(argv)
    path = RESULTS / f"identity_{args.size}.json"
    with BenchStorage() as storage:
        now = output_digests(Context(storage=storage, quick=True), args.size)
    if args.action == "record":
        path.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        say(f"recorded {len(now)} digests in {os.path.relpath(path)}")
        return 0
    differences = compare(json.loads(path.read_text()), now)
    for line in differences:
        say(f"  DIFFERS {line}")
    say(f"{len(now)} outputs, {len(differences)} differ from {os.path.relpath(path)}")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
