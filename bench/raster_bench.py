"""Where the time and memory of the raster half go, against Azurite, with figures printed.

    .venv/bin/python -m bench.raster_bench            # 10240² and 20480² x 3 bands uint16
    .venv/bin/python -m bench.raster_bench --quick    # 2048² and 4096²: a minute or two

For each scene size, side by side in one run:
- baseline: ``rio cogeo create`` on the whole local scene (one process, all it wants);
- pipeline: every window rendered by two worker processes reading the uploaded scene through
  /vsiaz/ (as two Function instances would), then ``assemble_mosaic`` in a fresh process, by
  block copy (the default) and through the tuned VRT -> COG path;
- peak RSS (ru_maxrss of each child process) of one tile worker rendering one 1024 window and of
  each assembly; wall times; the per-step timings the library reports.

Nothing about time is asserted: the figures are printed and written to bench/results/raster.json.
Scenes are cached in bench/data/ (gitignored) between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"
RESULTS = ROOT / "bench" / "results" / "raster.json"
PYTHON = sys.executable
WORKERS = 2


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MB.

    Read by each child about itself: on Linux, ru_maxrss survives exec, so a child's rusage would
    report at least the parent's size at fork (this benchmark's own ~200 MB) whatever it used.
    """
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_child(args: list[str], env: dict | None = None) -> tuple[float, float, dict]:
    """Run one of this module's child entry points: (wall seconds, its peak RSS in MB, its JSON report)."""
    started = time.perf_counter()
    proc = subprocess.run([PYTHON, "-m", "bench.raster_bench", *args], capture_output=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])}... exited {proc.returncode}:\n{proc.stderr.decode()[-3000:]}")
    report = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return wall, report.pop("peak_rss_mb"), report


def report_line(data: dict) -> None:
    print(json.dumps({**data, "peak_rss_mb": peak_rss_mb()}))


# --------------------------------------------------------------------------- child entry points


def _clients():
    from tilecommit.settings import Settings
    from tilecommit.storage import StorageConnection

    connection = StorageConnection.from_env()
    settings = Settings.from_env()
    blobs, tables = connection.blob_service(), connection.table_service()
    return connection, settings, blobs, tables


def child_render(job_id: str, source: str, window_ids: list[str], width: int, height: int) -> None:
    from tilecommit.grid import window_for_id
    from tilecommit.raster import render_tile

    connection, settings, blobs, tables = _clients()
    tiles = blobs.get_container_client(settings.tiles_container)
    manifest = tables.get_table_client(settings.manifest_table)
    options = connection.gdal_options()
    totals: dict[str, float] = {}
    nbytes = 0
    for window_id in window_ids:
        window = window_for_id(window_id, width, height, settings.window_size)
        result = render_tile(source, window, job_id=job_id, tiles=tiles, manifest=manifest, settings=settings,
                             gdal_options=options)
        nbytes += result.nbytes
        for key, value in result.timings.items():
            totals[key] = totals.get(key, 0.0) + value
    report_line({"windows": len(window_ids), "nbytes": nbytes, "timings": totals})


def child_assemble(job_id: str, scene_json: str, method: str) -> None:
    from tilecommit.raster import SceneInfo, assemble_mosaic

    connection, settings, blobs, tables = _clients()
    scene = SceneInfo.from_dict(json.loads(scene_json))
    result = assemble_mosaic(
        job_id,
        scene,
        tiles=blobs.get_container_client(settings.tiles_container),
        output=blobs.get_container_client(settings.output_container),
        manifest=tables.get_table_client(settings.manifest_table),
        settings=settings,
        gdal_options=connection.gdal_options(),
        method=method,
    )
    report_line(result.to_dict())


# --------------------------------------------------------------------------- the run


def scene_path(size: int) -> Path:
    from bench.scenes import SceneSpec, write_scene

    DATA.mkdir(parents=True, exist_ok=True)
    path = DATA / f"scene_{size}x{size}x3_uint16.tif"
    if not path.exists():
        started = time.perf_counter()
        partial = path.with_suffix(".partial.tif")
        write_scene(str(partial), SceneSpec(size, size, 3, "uint16", nodata=0))
        partial.rename(path)
        print(f"  generated {path.name} in {time.perf_counter() - started:.1f} s ({path.stat().st_size / 2**20:.0f} MiB)")
    return path


def baseline(path: Path, workdir: str) -> dict:
    out = os.path.join(workdir, "baseline_cog.tif")
    wall, rss, report = run_child(["baseline", str(path), out])
    size = os.path.getsize(out)
    os.remove(out)
    return {"wall_s": round(wall, 2), "peak_rss_mb": rss, "nbytes": size,
            "command": report["command"].replace(str(path), "SRC").replace(out, "DST")}


def pipeline(size: int, path: Path, env: dict, blobs, tables, settings, methods: list[str]) -> dict:
    from tilecommit.grid import plan_windows
    from tilecommit.raster import inspect_source
    from tilecommit.storage import StorageConnection, vsiaz_path

    connection = StorageConnection.from_env(environ=env)
    upload_name = f"uploads/{path.name}"
    started = time.perf_counter()
    with open(path, "rb") as f:
        blobs.get_container_client(settings.input_container).upload_blob(upload_name, f, overwrite=True, max_concurrency=4)
    upload_s = time.perf_counter() - started
    source = vsiaz_path(settings.input_container, upload_name)
    scene = inspect_source(source, settings=settings, gdal_options=connection.gdal_options())
    windows = plan_windows(scene.width, scene.height, settings.window_size)
    result: dict = {"upload_s": round(upload_s, 2), "windows": len(windows), "window_size": settings.window_size}

    # One tile worker, one 1024 window, in a fresh process: its peak RSS.
    single_job = f"{size:08x}0000fff1"
    wall, rss, out = run_child(["render", single_job, source, windows[0].id, str(scene.width), str(scene.height)], env)
    _, imports_rss, _ = run_child(["imports"], env)
    result["one_tile_worker"] = {"wall_s": round(wall, 2), "peak_rss_mb": rss, "imports_only_rss_mb": imports_rss, **out}

    # All windows, two workers in parallel (like two instances of the tile activity).
    job = f"{size:08x}0000aaaa"
    shares = [[w.id for w in windows[i::WORKERS]] for i in range(WORKERS)]
    started = time.perf_counter()
    procs = []
    for share in shares:
        procs.append(subprocess.Popen(
            [PYTHON, "-m", "bench.raster_bench", "render", job, source, ",".join(share), str(scene.width), str(scene.height)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT))
    workers = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(err.decode()[-3000:])
        workers.append(json.loads(out.decode().strip().splitlines()[-1]))
    tiling_wall = time.perf_counter() - started
    step_totals: dict[str, float] = {}
    for worker in workers:
        for key, value in worker["timings"].items():
            step_totals[key] = round(step_totals.get(key, 0.0) + value, 2)
    result["tiling"] = {"wall_s": round(tiling_wall, 2), "workers": WORKERS, "tiles_nbytes": sum(w["nbytes"] for w in workers),
                        "summed_step_s": step_totals, "worker_peak_rss_mb": [w["peak_rss_mb"] for w in workers]}

    # Assembly in a fresh process per method, each into its own job's output (same tiles).
    result["assembly"] = {}
    for method in methods:
        assembly_job = job if method == methods[0] else f"{size:08x}0000{hash(method) & 0xffff:04x}"
        if assembly_job != job:
            _copy_manifest(tables, settings, job, assembly_job)
        wall, rss, mosaic = run_child(["assemble", assembly_job, json.dumps(scene.to_dict()), method], env)
        result["assembly"][method] = {
            "wall_s": round(wall, 2), "peak_rss_mb": rss, "nbytes": mosaic["nbytes"],
            "overview_levels": mosaic["overview_levels"], "method": mosaic["method"],
            "timings": {k: round(v, 2) for k, v in mosaic["timings"].items()},
        }
    first = result["assembly"][methods[0]]
    result["pipeline_wall_s"] = round(tiling_wall + first["wall_s"], 2)
    return result


def _copy_manifest(tables, settings, from_job: str, to_job: str) -> None:
    """Point a second job at the same tiles (manifest rows name the blobs), so each assembly method
    builds its own mosaic from identical tiles."""
    table = tables.get_table_client(settings.manifest_table)
    for row in table.query_entities("PartitionKey eq @job", parameters={"job": from_job}):
        entity = dict(row)
        entity["PartitionKey"] = to_job
        table.upsert_entity(entity)


def run(sizes: list[int], methods: list[str]) -> dict:
    from devhost.azurite import Azurite
    from tilecommit.settings import Settings
    from tilecommit.storage import StorageConnection

    import rasterio
    import rio_cogeo

    report: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "rasterio": rasterio.__version__,
                    "gdal": rasterio.__gdal_version__, "rio_cogeo": rio_cogeo.__version__},
        "scenes": {},
    }
    with tempfile.TemporaryDirectory(prefix="raster-bench-") as workdir, Azurite(in_memory=False, workdir=os.path.join(workdir, "azurite")) as azurite:
        env = dict(os.environ, AzureWebJobsStorage=azurite.connection_string)
        connection = StorageConnection.from_connection_string(azurite.connection_string)
        settings = Settings()
        blobs, tables = connection.blob_service(), connection.table_service()
        for name in (settings.input_container, settings.tiles_container, settings.output_container):
            blobs.create_container(name)
        for name in (settings.manifest_table, settings.claims_table):
            tables.create_table(name)
        for size in sizes:
            print(f"scene {size}x{size}x3 uint16")
            path = scene_path(size)
            entry = {"source_nbytes": path.stat().st_size}
            entry["baseline_rio_cogeo"] = baseline(path, workdir)
            print(f"  baseline rio cogeo create: {entry['baseline_rio_cogeo']['wall_s']} s, "
                  f"peak RSS {entry['baseline_rio_cogeo']['peak_rss_mb']} MB")
            entry["pipeline"] = pipeline(size, path, env, blobs, tables, settings, methods)
            p = entry["pipeline"]
            print(f"  one tile worker (1024² window): peak RSS {p['one_tile_worker']['peak_rss_mb']} MB "
                  f"(the same process only importing: {p['one_tile_worker']['imports_only_rss_mb']} MB), "
                  f"{p['one_tile_worker']['wall_s']} s with process start")
            print(f"  tiling {p['windows']} windows, {WORKERS} workers: {p['tiling']['wall_s']} s "
                  f"(summed steps {p['tiling']['summed_step_s']}; worker peak RSS {p['tiling']['worker_peak_rss_mb']} MB)")
            for method, figures in p["assembly"].items():
                print(f"  assembly ({method}): {figures['wall_s']} s, peak RSS {figures['peak_rss_mb']} MB, "
                      f"{figures['overview_levels']} overview levels; steps {figures['timings']}")
            print(f"  pipeline (tiling + {methods[0]} assembly): {p['pipeline_wall_s']} s "
                  f"vs baseline {entry['baseline_rio_cogeo']['wall_s']} s")
            report["scenes"][str(size)] = entry
    return report


def child_imports_only() -> None:
    """What a worker process weighs before it renders anything (interpreter, GDAL, SDKs)."""
    import tilecommit.raster  # noqa: F401

    _clients()
    report_line({})


def child_baseline(source: str, target: str) -> None:
    """``rio cogeo create`` in this process, so its peak RSS can be read afterwards."""
    from rio_cogeo.scripts.cli import cogeo

    args = ["create", source, target, "--cog-profile", "deflate", "--blocksize", "256", "--overview-blocksize", "256",
            "--overview-resampling", "average", "--quiet"]
    cogeo.main(args, standalone_mode=False)
    report_line({"command": "rio cogeo " + " ".join(args)})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "imports":
        return child_imports_only()
    if argv and argv[0] == "baseline":
        return child_baseline(argv[1], argv[2])
    if argv and argv[0] == "render":
        job, source, ids, width, height = argv[1:6]
        return child_render(job, source, ids.split(","), int(width), int(height))
    if argv and argv[0] == "assemble":
        return child_assemble(*argv[1:4])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small scenes (2048² and 4096²)")
    parser.add_argument("--sizes", help="comma-separated scene edges in pixels (overrides --quick)")
    parser.add_argument("--methods", default="blocks,vrt", help="assembly methods to run, the first counts for the pipeline")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([2048, 4096] if args.quick else [10240, 20480])
    report = run(sizes, args.methods.split(","))
    report["quick"] = bool(args.quick)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    key = "quick" if args.quick and not args.sizes else ("full" if not args.sizes else f"sizes-{args.sizes}")
    previous[key] = report
    RESULTS.write_text(json.dumps(previous, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)} [{key}]")


if __name__ == "__main__":
    main()
