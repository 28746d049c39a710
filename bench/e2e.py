"""End to end, side by side on the same scene in the same run: ``rio cogeo create`` vs our pipeline.

- baseline: ``.venv/bin/rio cogeo create SRC DST`` on the whole local scene, as a child process,
  in its default mode (in memory below 120 M pixels, ``--threads ALL_CPUS``) and with
  ``--no-in-memory``; the same output layout as ours (DEFLATE, 256-pixel blocks, average
  overviews);
- ours: ``python -m devhost process SRC`` as a child process with ``AzureWebJobsStorage`` on the
  bench Azurite: upload, BlobCreated, validate, plan, every window rendered and committed
  (4 activities at once, host.json), assembly, mosaic committed. One process is one instance.

Wall time, peak RSS (the child's own ru_maxrss from wait4) and CPU seconds of each; the ratio
ours / baseline is taken within each repeat and reported as min/median/max over repeats. The
three runs of a repeat are rotated so drift in the machine's load does not favour one of them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilecommit.settings import CONSUMPTION_INSTANCE_MB

from .common import (
    MACHINE_NOTE,
    PYTHON,
    RIO,
    Context,
    fmt_spread,
    pyplot,
    say,
    scene_path,
    spread,
    table,
)

#: rio-cogeo processes in memory below this many pixels unless told otherwise.
RIO_IN_MEMORY_PIXELS = 120_000_000
RIO_OPTIONS = [
    "--cog-profile",
    "deflate",
    "--blocksize",
    "256",
    "--overview-blocksize",
    "256",
    "--overview-resampling",
    "average",
    "--quiet",
]


def rio_cogeo(src: Path, workdir: str, *, in_memory: bool | None) -> dict:
    from .common import run_measured

    out = os.path.join(workdir, "rio_cog.tif")
    args = [RIO, "cogeo", "create", str(src), out, *RIO_OPTIONS]
    if in_memory is False:
        args.append("--no-in-memory")
    try:
        measured = run_measured(args)
        nbytes = os.path.getsize(out)
    finally:
        if os.path.exists(out):
            os.remove(out)
    return {
        **measured.summary(),
        "nbytes": nbytes,
        "command": " ".join(["rio"] + args[1:3] + ["SRC", "DST"] + args[5:]),
    }


def pipeline(ctx: Context, src: Path, env: dict) -> dict:
    """``python -m devhost process SRC`` in a child process; its JSON summary plus wait4 figures."""
    from .common import run_measured

    ctx.storage.ensure(env)
    args = [
        PYTHON,
        "-m",
        "devhost",
        "process",
        str(src),
        "--hub",
        env["BENCH_HUB"],
        "--progress",
        "never",
        "--timeout",
        "3600",
    ]
    azurite_before = ctx.storage.azurite_cpu_s()
    measured = run_measured(args, env={**os.environ, **env}, check=False)
    azurite_after = ctx.storage.azurite_cpu_s()
    try:
        summary = measured.json()
    except (ValueError, IndexError) as exc:
        raise RuntimeError(
            f"devhost process printed no summary (exit {measured.returncode}):\n{measured.stderr[-3000:]}"
        ) from exc
    if summary.get("status") != "completed":
        raise RuntimeError(
            f"devhost process: job {summary.get('job_id')} {summary.get('status')}: {summary.get('error')}"
        )
    return {
        **measured.summary(),
        "elapsed_s": summary["elapsed_s"],
        "job_id": summary["job_id"],
        "windows": summary["windows"],
        "written": summary["written"],
        "bytes": summary["bytes"],
        "host": summary.get("host", {}),
        "blob": src.name,
        # The user's part (the upload, on the user's machine in Azure), in the process's CPU above.
        "upload_cpu_s": summary["upload_cpu_s"],
        "azurite_cpu_s": None if azurite_before is None else round(azurite_after - azurite_before, 2),
    }


@dataclass
class KeptRun:
    """The last pipeline run of one size, kept for the modules that measure its pieces again:
    its scene (uploaded, tiles rendered, manifest complete) and its app settings."""

    settings: Any
    source: str
    scene: Any
    windows: list
    child_env: dict
    job_id: str

    @classmethod
    def of(cls, ctx: Context, kept: dict) -> KeptRun:
        """From an entry of ``run(...)["keep"]``: ``{"env", "job_id", "blob"}``."""
        from tilecommit.grid import plan_windows
        from tilecommit.raster import PinnedBlob, inspect_source
        from tilecommit.settings import Settings
        from tilecommit.spec import OutputSpec

        env = kept["env"]
        settings = Settings.from_env(env)
        # The upload's blob name: the workers read it as the app does (bench.workers.pinned_upload).
        source = kept["blob"]
        blob = ctx.storage.connection.blob_service().get_blob_client(settings.input_container, source)
        scene = inspect_source(
            PinnedBlob(blob, blob.get_blob_properties().etag),
            settings=settings,
            spec=OutputSpec.from_settings(settings),
        )
        return cls(
            settings=settings,
            source=source,
            scene=scene,
            windows=plan_windows(scene.width, scene.height, settings.window_size),
            # The app settings for a worker process; the task hub is the local host's alone.
            child_env={**os.environ, **{k: v for k, v in env.items() if k != "BENCH_HUB"}},
            job_id=kept["job_id"],
        )


def total_cpu(entry: dict) -> None:
    """Our CPU including the storage emulator's (Azurite does the storage work rio never needs)."""
    azurite = entry["ours"].get("azurite_cpu_s")
    if azurite is not None:
        entry["ratio_cpu_with_azurite_vs_rio_default"] = (entry["ours"]["cpu_s"] + azurite) / entry["rio_default"][
            "cpu_s"
        ]


def figures_for(runs: list[dict]) -> dict:
    for entry in runs:
        if "ratio_cpu_with_azurite_vs_rio_default" not in entry:
            total_cpu(entry)
    return {
        "ratio_cpu_with_azurite_vs_rio_default": spread(r.get("ratio_cpu_with_azurite_vs_rio_default") for r in runs)
    }


def run(
    ctx: Context,
    sizes: list[int],
    repeats: dict[int, int] | int,
    *,
    scenes: dict[int, Path] | None = None,
    window_size: int = 1024,
) -> dict:
    """Returns {"sizes": {size: {...}}, "keep": {size: {"env", "job_id", "blob"} of the last pipeline run}}
    (its containers stay for the memory bench; the caller drops them)."""
    report: dict = {"sizes": {}, "note": MACHINE_NOTE, "rio_options": " ".join(RIO_OPTIONS)}
    keep: dict[int, dict] = {}
    for size in sizes:
        n = repeats.get(size, 1) if isinstance(repeats, dict) else repeats
        src = (scenes or {}).get(size) or scene_path(size)
        modes = ["rio_default", "ours"]
        if size * size < RIO_IN_MEMORY_PIXELS:
            modes.insert(1, "rio_no_in_memory")
        runs: list[dict] = []
        say(f"e2e {size}x{size}x3 uint16 ({src.stat().st_size / 2**20:.0f} MiB), {n} repeat(s): {', '.join(modes)}")
        for rep in range(n):
            order = modes[rep % len(modes) :] + modes[: rep % len(modes)]
            entry: dict = {}
            with tempfile.TemporaryDirectory(prefix="tilecommit-bench-rio-") as workdir:
                for mode in order:
                    if mode == "ours":
                        env = ctx.storage.app_env(f"e2e-{size}-{rep}", window_size=window_size)
                        entry[mode] = pipeline(ctx, src, env)
                        if size in keep:
                            ctx.storage.drop(keep[size]["env"])
                        keep[size] = {"env": env, "job_id": entry[mode]["job_id"], "blob": src.name}
                    else:
                        entry[mode] = rio_cogeo(src, workdir, in_memory=False if mode == "rio_no_in_memory" else None)
                    say(
                        f"  repeat {rep + 1}/{n} {mode}: {entry[mode]['wall_s']:.1f} s, "
                        f"peak RSS {entry[mode]['peak_rss_mb']:.0f} MiB (load {entry[mode]['load1_before']})"
                    )
            entry["ratio_wall_vs_rio_default"] = entry["ours"]["wall_s"] / entry["rio_default"]["wall_s"]
            entry["ratio_cpu_vs_rio_default"] = entry["ours"]["cpu_s"] / entry["rio_default"]["cpu_s"]
            entry["ratio_cpu_without_upload_vs_rio_default"] = (
                entry["ours"]["cpu_s"] - entry["ours"]["upload_cpu_s"]
            ) / entry["rio_default"]["cpu_s"]
            total_cpu(entry)
            if "rio_no_in_memory" in entry:
                entry["ratio_wall_vs_rio_no_in_memory"] = entry["ours"]["wall_s"] / entry["rio_no_in_memory"]["wall_s"]
            runs.append(entry)
        figures = {
            "repeats": n,
            "scene_bytes": src.stat().st_size,
            "runs": runs,
            "windows": runs[0]["ours"]["windows"],
        }
        for mode in modes:
            for key in ("wall_s", "peak_rss_mb", "cpu_s"):
                figures[f"{mode}_{key}"] = spread(r[mode][key] for r in runs)
        figures["ours_elapsed_s"] = spread(r["ours"]["elapsed_s"] for r in runs)
        figures["ours_azurite_cpu_s"] = spread(r["ours"]["azurite_cpu_s"] for r in runs)
        figures.update(figures_for(runs))
        figures["ours_upload_cpu_s"] = spread(r["ours"]["upload_cpu_s"] for r in runs)
        for key in (
            "ratio_wall_vs_rio_default",
            "ratio_cpu_vs_rio_default",
            "ratio_cpu_without_upload_vs_rio_default",
            "ratio_wall_vs_rio_no_in_memory",
        ):
            figures[key] = spread(r[key] for r in runs if key in r)
        if "rio_no_in_memory" not in modes:
            figures["rio_no_in_memory_note"] = (
                f"not run: {size}² is over rio-cogeo's {RIO_IN_MEMORY_PIXELS // 10**6} M-pixel in-memory threshold, "
                "so its default already is --no-in-memory"
            )
        report["sizes"][str(size)] = figures
    report["keep"] = {str(k): v for k, v in keep.items()}
    return report


def print_report(report: dict) -> None:
    rows = []
    for size, f in report["sizes"].items():
        for mode, label in (
            ("rio_default", "rio cogeo create (default, all threads)"),
            ("rio_no_in_memory", "rio cogeo create --no-in-memory"),
            ("ours", "ours: devhost process (upload..mosaic)"),
        ):
            if f.get(f"{mode}_wall_s", {}).get("n"):
                rows.append(
                    [
                        f"{size}²",
                        label,
                        fmt_spread(f[f"{mode}_wall_s"], " s", 1),
                        fmt_spread(f[f"{mode}_peak_rss_mb"], " MiB", 0),
                        fmt_spread(f[f"{mode}_cpu_s"], " s", 1),
                    ]
                )
        rows.append(
            [
                f"{size}²",
                "ratio ours / rio default (same repeat)",
                fmt_spread(f["ratio_wall_vs_rio_default"], "x"),
                f"limit {CONSUMPTION_INSTANCE_MB:.0f} MiB",
                fmt_spread(f["ratio_cpu_vs_rio_default"], "x"),
            ]
        )
        if f.get("ratio_cpu_without_upload_vs_rio_default", {}).get("n"):
            rows.append(
                [
                    f"{size}²",
                    f"ratio ours without the upload's {fmt_spread(f['ours_upload_cpu_s'], ' CPU-s', 1)} / rio default",
                    "",
                    "",
                    fmt_spread(f["ratio_cpu_without_upload_vs_rio_default"], "x"),
                ]
            )
        with_azurite = figures_for(f["runs"])["ratio_cpu_with_azurite_vs_rio_default"]
        if with_azurite["n"]:
            rows.append([f"{size}²", "ratio ours + Azurite CPU / rio default", "", "", fmt_spread(with_azurite, "x")])
        if f["ratio_wall_vs_rio_no_in_memory"]["n"]:
            rows.append(
                [
                    f"{size}²",
                    "ratio ours / rio --no-in-memory",
                    fmt_spread(f["ratio_wall_vs_rio_no_in_memory"], "x"),
                    "",
                    "",
                ]
            )
    print(f"\n## 1. End to end, same scene, same run ({report['note']})")
    print(table(rows, ["scene", "what", "wall median [min-max]", "peak RSS", "CPU s"]))
    for size, f in report["sizes"].items():
        if f.get("ours_azurite_cpu_s", {}).get("n"):
            print(
                f"  {size}²: ours' CPU above is the devhost process only; the storage emulator (Azurite, Node) used "
                f"{fmt_spread(f['ours_azurite_cpu_s'], ' CPU-s', 1)} more during our runs; upload to completion "
                f"(elapsed_s) {fmt_spread(f['ours_elapsed_s'], ' s', 1)}"
            )
        if f.get("rio_no_in_memory_note"):
            print(f"  {size}²: rio --no-in-memory {f['rio_no_in_memory_note']}")


def chart(report: dict, path: Path) -> Path:
    """Bar chart: wall time and peak RSS of each, per scene size, the 1.5 GB line drawn."""
    plt = pyplot()
    sizes = list(report["sizes"])
    modes = [
        ("rio_default", "rio cogeo (default)"),
        ("rio_no_in_memory", "rio cogeo --no-in-memory"),
        ("ours", "ours (devhost process)"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.26
    for i, (mode, label) in enumerate(modes):
        for ax, key in zip(axes, ("wall_s", "peak_rss_mb"), strict=True):
            xs, ys, lo, hi = [], [], [], []
            for j, size in enumerate(sizes):
                s = report["sizes"][size].get(f"{mode}_{key}")
                if not s or not s.get("n"):
                    continue
                xs.append(j + (i - 1) * width)
                ys.append(s["median"])
                lo.append(s["median"] - s["min"])
                hi.append(s["max"] - s["median"])
            if xs:
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=label)
    for ax, title in zip(axes, ("wall time, s (median, min-max)", "peak RSS, MiB"), strict=True):
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([f"{s}²x3 uint16" for s in sizes])
        ax.set_title(title)
    axes[1].axhline(CONSUMPTION_INSTANCE_MB, color="red", linestyle="--", linewidth=1)
    axes[1].text(-0.4, CONSUMPTION_INSTANCE_MB * 1.02, "1.5 GB instance limit", color="red", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"End to end, same scene, same run ({MACHINE_NOTE})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
