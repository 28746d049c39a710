"""The commit step's own time, with the coarse levels computed by the commit or by the reduction tree.

    python -m bench.commit_step [--sizes 10240,20480,40960] [--threads 2]

For each size, a scene of ``size``² x 3 uint16 in 1024-pixel windows is made of one real tile
(the tile encoder's, of a smooth 1024² gradient: it compresses to a few hundred KB, so that
1600 tiles fit the bench Azurite) stored under every window's name, with a manifest row each.
Then, side by side on the same tiles, in this process:

- the tree's nodes (``reduce_node``, stage after stage, ``threads`` at a time): each node's
  seconds; on Azure a stage's nodes run at once, so the tree's wall is about the sum over stages
  of its slowest node (printed as ``tree wall (model)``);
- the commit step's own part (``planned_block_copy``: manifest rows, tile heads, the coarse
  levels, the head's check and the copy plan; not the copies, which the service makes, nor the
  Put Blocks) three times: computing the coarse levels itself (a payload without a tree),
  stitching the tree's intermediates read whole (``staged``: a job from before the service
  copied them), and stitching them from the heads the tree's last node carries (``copied``);
- planning the mosaic's shares (``plan_shares``, four shares) three times: reading every tile's
  head, taking the heads the tree's first stage carries (a job from before), and taking those
  the last node carries.

Printed (and written to bench/results/commit_step.json): the seconds of each part and the ratio
of the largest size to the smallest. Nothing is
asserted. Pixels do not matter here (tests/test_level_tree.py shows the two mosaics are the same
bytes); the tile is smooth so the bench's storage stays small, which makes the coarse levels'
encoding cheaper than on real data.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .common import RESULTS, BenchStorage, load1, say, table

WINDOW = 1024


def _tile_body(workdir: str) -> tuple[bytes, object]:
    """One 1024² tile of a smooth 3-band uint16 gradient, as the tile encoder makes it; and its scene."""
    import rasterio
    from rasterio.transform import from_origin

    from tilecommit.raster import inspect_source
    from tilecommit.raster.tiling.encode import encode_tile
    from tilecommit.settings import Settings
    from tilecommit.spec import OutputSpec

    path = f"{workdir}/tile-scene.tif"
    y, x = np.mgrid[0:WINDOW, 0:WINDOW]
    pixels = np.stack([(x * 40) % 65535, (y * 40) % 65535, ((x + y) * 20) % 65535]).astype("uint16")
    profile = dict(driver="GTiff", width=WINDOW, height=WINDOW, count=3, dtype="uint16", crs="EPSG:32633")
    with rasterio.open(path, "w", transform=from_origin(500000, 4600000, 10, 10), **profile) as dst:
        dst.write(pixels)
    spec = OutputSpec.from_settings(Settings(window_size=WINDOW))
    scene = inspect_source(path, settings=Settings(window_size=WINDOW), spec=spec)
    with rasterio.open(path) as src:
        body, _ = encode_tile(src, rasterio.windows.Window(0, 0, WINDOW, WINDOW), spec=spec, num_threads=1)
    return body, scene


def _store_tiles(job, stores, body: bytes, size: int) -> None:
    from tilecommit import gates, jobs
    from tilecommit.grid import plan_windows
    from tilecommit.manifest import record_manifest_entry

    digest = gates.sha256_hex(body)

    def one(window) -> None:
        name = jobs.tile_blob_name(job.job_id, window)
        answer = stores.tiles.get_blob_client(name).upload_blob(body, overwrite=True)
        record_manifest_entry(
            stores.manifest,
            job_id=job.job_id,
            window=window,
            uri=name,
            nbytes=len(body),
            sha256=digest,
            etag=answer["etag"],
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, plan_windows(size, size, WINDOW)))


def _run_tree(job, stores, scene, tree, threads: int) -> tuple[float, float, int]:
    """(seconds of all nodes here, the model's wall: the sum over stages of the slowest node, nodes)."""
    from tilecommit.raster.assembly.level_nodes import reduce_node

    total, model, nodes = 0.0, 0.0, 0
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for s, stage in enumerate(tree.stages):
            results = list(pool.map(lambda rc, s=s: reduce_node(job, stores, scene, tree, s, *rc), stage.nodes))
            model += max(r["seconds"] for r in results)
            nodes += len(results)
    total = time.perf_counter() - started
    return total, model, nodes


def _commit_part(job, stores, scene) -> dict[str, float]:
    from tilecommit.raster.assembly.block_copy import planned_block_copy
    from tilecommit.raster.assembly.strategy import mosaic_job

    timings: dict[str, float] = {}
    started = time.perf_counter()
    with mosaic_job(job, stores, scene, timings) as assembly, planned_block_copy(assembly):
        pass
    timings["total"] = time.perf_counter() - started
    return timings


def _planning(job, stores, scene, share_bytes: int) -> float:
    """Seconds of planning the mosaic's shares (``plan_shares``: manifest, tile heads, layout, the
    plan blob's create-only write); with a tree the heads come with its first stage."""
    from tilecommit.raster.assembly.shares import StagedShares, plan_shares

    started = time.perf_counter()
    staged = plan_shares(job, stores, scene, share_bytes=share_bytes)
    assert isinstance(staged, StagedShares), staged
    return time.perf_counter() - started


def run(sizes: list[int], threads: int, storage: BenchStorage | None = None) -> list[dict]:
    """The rows of :func:`main`'s table, on ``storage`` (default: a private Azurite of its own)."""
    with contextlib.ExitStack() as stack:
        own = storage if storage is not None else stack.enter_context(BenchStorage())
        return _run(own, sizes, threads)


def _run(storage: BenchStorage, sizes: list[int], threads: int) -> list[dict]:
    from tilecommit.jobs import Job
    from tilecommit.raster.assembly.reduction import plan_level_tree
    from tilecommit.settings import Settings
    from tilecommit.stores import JobStores

    rows = []
    with tempfile.TemporaryDirectory(prefix="commit-step-") as workdir:
        body, tile_scene = _tile_body(workdir)
        say(f"one tile: {len(body)} bytes")
        for size in sizes:
            env = storage.app_env(f"commit{size}", window_size=WINDOW)
            storage.ensure(env)
            settings = Settings.from_env(env)
            blobs, tables = storage.connection.blob_service(), storage.connection.table_service()
            stores = JobStores(
                blobs.get_container_client(settings.tiles_container),
                blobs.get_container_client(settings.output_container),
                tables.get_table_client(settings.manifest_table),
                settings,
            )
            scene = dataclasses.replace(tile_scene, width=size, height=size)
            single = Job(f"{size:08x}c0ffee00"[:16], "bench", url="", etag="", size=0, spec=_spec(), batch_size=64)
            staged_job = dataclasses.replace(single, coarse_levels_per_node=2)
            tree_job = dataclasses.replace(staged_job, coarse_levels_copied=True)
            say(f"{size}²: storing {(size // WINDOW) ** 2} tiles")
            _store_tiles(single, stores, body, size)
            tree = plan_level_tree(size, size, tree_job.spec, 2)
            assert tree is not None, size
            here, model, nodes = _run_tree(tree_job, stores, scene, tree, threads)
            computed = _commit_part(single, stores, scene)
            staged = _commit_part(staged_job, stores, scene)
            stitched = _commit_part(tree_job, stores, scene)
            share_bytes = len(body) * (size // WINDOW) ** 2 // 4  # four shares
            planning_read = _planning(single, stores, scene, share_bytes)
            planning_first_stage = _planning(staged_job, stores, scene, share_bytes)
            planning_carried = _planning(tree_job, stores, scene, share_bytes)
            rows.append(
                {
                    "size": size,
                    "windows": (size // WINDOW) ** 2,
                    "stages": len(tree.stages),
                    "nodes": nodes,
                    "tree_here_s": here,
                    "tree_wall_model_s": model,
                    "commit_computing": computed,
                    "commit_staging_intermediates": staged,
                    "commit_stitching": stitched,
                    "planning_heads_read_s": planning_read,
                    "planning_first_stage_heads_s": planning_first_stage,
                    "planning_heads_carried_s": planning_carried,
                }
            )
            say(f"{size}²: {rows[-1]}")
            storage.drop(env)
    return rows


def _spec():
    from tilecommit.settings import Settings
    from tilecommit.spec import OutputSpec

    return OutputSpec.from_settings(Settings(window_size=WINDOW))


#: The commit step's three forms: (as printed, its key in a row).
HOWS = (
    ("computing", "commit_computing"),
    ("stitching, staged", "commit_staging_intermediates"),
    ("stitching, copied", "commit_stitching"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_step")
    parser.add_argument("--sizes", default="10240,20480,40960")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    load_before = load1()
    rows = run([int(s) for s in args.sizes.split(",")], args.threads)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "commit_step.json").write_text(
        json.dumps(
            {"threads": args.threads, "load1_before": load_before, "load1_after": load1(), "rows": rows}, indent=2
        )
    )
    parts = ("manifest", "intermediates", "tile_heads", "tile_levels", "coarse_levels", "check", "total")
    print(
        table(
            [
                [f"{r['size']}²", r["windows"], f"{r['stages']}/{r['nodes']}", how]
                + [f"{r[key].get(p, 0.0):.2f}" for p in parts]
                + [f"{r['tree_wall_model_s']:.2f}" if how != "computing" else ""]
                for r in rows
                for how, key in HOWS
            ],
            ["scene", "windows", "stages/nodes", "coarse levels", *(f"{p} s" for p in parts), "tree wall (model) s"],
        )
    )
    print(
        table(
            [
                [f"{r['size']}²"]
                + [
                    f"{r[k]:.2f}"
                    for k in ("planning_heads_read_s", "planning_first_stage_heads_s", "planning_heads_carried_s")
                ]
                for r in rows
            ],
            [
                "scene",
                "planning the shares, heads read one by one s",
                "carried by the first stage s",
                "carried by the last node s",
            ],
        )
    )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        for how, key in HOWS:
            ratio = last[key]["total"] / first[key]["total"]
            print(f"commit step {how}: {last['size']}² / {first['size']}² = {ratio:.2f}")


if __name__ == "__main__":
    main()
