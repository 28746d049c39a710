"""Smoke test of the bench suite: the quickest piece of each module on tiny inputs.

Checks that every module runs and returns well-formed, self-consistent figures (the right keys,
counts that add up). It asserts nothing about time: benchmarks print, they do not judge.
"""

from __future__ import annotations

import pytest

from bench import (
    breakdown,
    commit_step,
    contention,
    cpu_floor,
    duplicates,
    e2e,
    levels,
    memory,
    orchestration,
    raster,
    s2s,
    split,
)
from bench import collections as collection_bench
from bench.__main__ import targets
from bench.common import BenchStorage, Context, tiny_scene
from bench.terrain import write_terrain

WINDOW = 256


@pytest.fixture(scope="module")
def ctx(azurite):
    with BenchStorage(connection_string=azurite.connection_string) as storage:
        yield Context(storage, quick=True)


def test_contention_lab_counts_add_up(ctx):
    report = contention.run(ctx, workers=3, keys=3, rounds=3, body_kib=1, mode="thread")
    (run,) = report["runs"]
    assert run["winners_per_round"] == [3, 3, 3]  # exactly one winner per key per round
    assert run["losers_per_round"] == [2 * 3] * 3  # (n - 1) x keys
    assert run["errors"] == 0 and run["keys_without_exactly_one_winner"] == 0
    assert run["attempts"] == 3 * 3 * 3
    assert sum(run["observed"]) == 3 * 3 and len(run["observed"]) == len(run["expected"]) == 3
    assert sum(run["expected"]) == pytest.approx(9, abs=0.05)
    assert 0.0 <= run["p_overlap"] <= 1.0
    assert len(run["p_by_key_position"]) == 3


def test_contention_analysis_of_known_records():
    # key 0: worker 0 wins at t=1..2; worker 1 sent at 1.5 (overlaps), worker 2 sent at 3 (late).
    records = [
        (0, 0, 0, 1.0, 2.0, "written", 0),
        (0, 0, 1, 1.5, 2.5, "already-present", 0),
        (0, 0, 2, 3.0, 3.5, "already-present", 0),
    ]
    result = contention.analyse(records, workers=3, keys=1, rounds=1)
    assert result["observed"] == [0, 1, 0]
    assert result["p_overlap"] == 0.5
    assert result["expected"] == [0.25, 0.5, 0.25]


def test_collection_race_and_one_add_count_up(output, capsys):
    outcome = collection_bench.race(output, items=4, rounds=1)
    assert (outcome["lost"], outcome["doubled"], outcome["failures"]) == (0, 0, 0)
    assert len(outcome["publications"]) == 8  # 4 items, each delivered twice
    assert all(attempts >= refused for refused, attempts in outcome["publications"])
    collection_bench.one_add(output, 300)
    assert "one add into a collection of 300 entries" in capsys.readouterr().out


def test_collection_model_of_known_publications():
    """Two publications: 1 refusal in 3 writes (2 landed), 0 in 2: p = 1/5; each publication's
    refusals ~ NegBin(2 landed, p)."""
    fitted = collection_bench.model([(1, 3), (0, 2)])
    assert fitted["p"] == pytest.approx(0.2)
    assert fitted["observed"] == [1, 1]
    assert fitted["expected"] == pytest.approx([2 * 0.8**2, 2 * 2 * 0.2 * 0.8**2])
    assert fitted["model_mean"] == pytest.approx(2 * 0.2 / 0.8)


def test_orchestration_scale_on_the_real_orchestrators(ctx):
    report = orchestration.run(ctx, [20, 50], 1)
    for windows, figures in report["sizes"].items():
        (run,) = figures["runs"]
        assert run["windows"] == run["output_windows"] == run["render_tile_executions"] == int(windows)
        assert run["output_written"] == int(windows)
        assert run["batches"] == -(-int(windows) // 64)
        assert run["largest_history"] >= run["parent_history"] > 0
        assert figures["consistent"]
    assert report["ratio_replay_per_1000_s"] is not None and report["ratio_sizes"] == "50 / 20"


def test_breakdown_and_duplicates_on_a_tiny_scene(ctx, tmp_path):
    scene = tiny_scene(tmp_path / "tiny.tif", 512)  # 2 x 2 windows of 256
    report = breakdown.run(
        ctx,
        scene,
        window_size=WINDOW,
        host_options={"timer_scale": 0.01, "watch_interval": 0.1},
        after=duplicates.after_first_run(2),
    )
    dup = report.pop("after")
    assert report["windows"] == report["windows_encoded"] == 4
    assert set(report["tile_steps_sum_s"]) == set(breakdown.TILE_STEPS)
    assert set(report["overhead_fraction_of_encode"]) == {
        "commit",
        "manifest (check + row)",
        "orchestration (episodes)",
    }
    assert report["timeline"]["job_elapsed_s"] >= report["timeline"]["tiling_s"] > 0
    assert report["orchestration"]["episodes"] > 0 and report["gate_cost"]["bodies"] == 4
    red = dup["redelivery"]
    assert red["decisions"] == ["duplicate"] and red["tiles_reencoded"] == 0 and red["activity_executions"] == 0
    assert len(red["runs"]) == 2
    rerun = dup["forced_rerun"]
    assert rerun["status"] == "Completed" and rerun["tiles_reencoded"] == 0 and rerun["windows_skipped"] == 4
    assert rerun["mosaic_outcome"] == "already-present"
    twice = duplicates.duplicate_activities(ctx, report, host_options={"timer_scale": 0.01, "watch_interval": 0.1})
    assert twice["render_tile_executions"] == 2 * 4
    assert twice["outcomes"].get("written") == 4
    assert twice["encoded"] + twice["skipped_by_manifest_check"] == 8
    verdicts = {
        t.name: t.verdict for t in targets({"breakdown": report, "duplicates": {**dup, "duplicate_activities": twice}})
    }
    assert len(verdicts) == 2 and set(verdicts.values()) <= {"PASS", "MISS"}


@pytest.mark.slow
def test_e2e_and_memory_on_a_tiny_scene(ctx, tmp_path):
    scene = tiny_scene(tmp_path / "tiny.tif", 512)
    report = e2e.run(ctx, [512], 1, scenes={512: scene}, window_size=WINDOW)
    keep = report.pop("keep")
    figures = report["sizes"]["512"]
    (run,) = figures["runs"]
    assert set(run) >= {"rio_default", "rio_no_in_memory", "ours", "ratio_wall_vs_rio_default"}
    assert run["ours"]["windows"] == run["ours"]["written"] == 4
    assert all(run[m]["peak_rss_mb"] > 0 and run[m]["wall_s"] > 0 for m in ("rio_default", "rio_no_in_memory", "ours"))
    # The upload's CPU is part of the process's, and the ratio without it is below the whole one.
    assert 0 < run["ours"]["upload_cpu_s"] < run["ours"]["cpu_s"]
    assert run["ratio_cpu_without_upload_vs_rio_default"] < run["ratio_cpu_vs_rio_default"]
    mem = memory.run(ctx, [512], keep, report, tile_windows=2)
    entry = mem["sizes"]["512"]
    assert entry["windows"] == 4 and entry["tile_worker"]["windows_rendered"] == 2
    assert entry["assembly"]["method"] in ("server", "blocks", "vrt")
    # Each figure is rounded to 0.1 MiB: the sum can be off by half a unit per rounded term.
    assert entry["tiling_instance_mb"] == pytest.approx(
        entry["baseline"]["peak_rss_mb"] + entry["concurrency"] * entry["tile_increment_mb"],
        abs=0.05 * (entry["concurrency"] + 2) + 1e-9,
    )
    half = raster.run(ctx, [512], keep)["sizes"]["512"]
    assert half["windows"] == 4 and len(half["tiling"]["worker"]) == raster.WORKERS
    assert half["tiling"]["tiles_nbytes"] > 0 and set(half["tiling"]["summed_step_s"]) >= {"read", "encode"}
    assert set(half["assembly"]) == set(raster.METHODS)
    assert {a["method"] for a in half["assembly"].values()} == set(raster.METHODS)
    assert all(a["peak_rss_mb"] > 0 and a["overview_levels"] >= 1 for a in half["assembly"].values())
    server = half["assembly"]["server"]
    assert server["transfer"]["copied_by_service"] + server["transfer"]["sent_from_instance"] == server["nbytes"]
    # Every byte through the SDK's pinned reader, none through GDAL's /vsiaz/ (the committed mosaic's check included).
    assert server["http_bodies"]["sdk"]["requests"] > 0 and server["http_bodies"]["gdal"]["received"] == 0
    for kept in keep.values():
        ctx.storage.drop(kept["env"])


@pytest.mark.slow
def test_storage_to_storage_on_a_tiny_terrain(ctx, tmp_path):
    scene = write_terrain(tmp_path / "terrain.tif", 512)
    entry = s2s.measure(ctx, "terrain", scene, 512)
    assert set(entry["rio_storage"]) == {"download", "vsiaz"}
    assert all(r["nbytes"] > 0 and r["wall_s"] > 0 for r in entry["rio_storage"].values())
    assert entry["ours"]["mosaic_bytes"] > 0 and entry["ours"]["upload_to_mosaic_s"] >= 0
    assert entry["ratio_file_to_file"] > 0 and entry["raw_bytes"] == 512 * 512 * 3 * 2


def test_deflate_levels_on_a_tiny_terrain(tmp_path, capsys):
    scene = write_terrain(tmp_path / "terrain.tif", 512)
    measured = levels.measure(scene, windows=2, window_size=256)
    assert list(measured) == [f"level_{n}" for n in range(1, 10)]
    assert all(m["cpu_s_per_window"] > 0 and m["bytes"] > 0 for m in measured.values())
    assert measured["level_1"]["bytes"] != measured["level_9"]["bytes"]  # the level reached the encoder
    levels.print_report({"windows": 2, "window_size": 256, "scenes": {"terrain": measured}})
    out = capsys.readouterr().out
    assert "2 tiles of 256² per scene" in out and "| terrain | 6     |" in out


def test_split_staging_against_one_activity_on_the_same_tiles(ctx, capsys):
    report = split.run(ctx.storage, 2048, share_mb=1, slots=4, repeats=1)
    single, shares = sorted(report["runs"], key=lambda r: r["path"] != "single")
    assert (single["path"], shares["path"]) == ("single", "shares")
    assert single["outcome"] == shares["outcome"] == "written"
    assert shares["transfer"]["shares"] > 1 and single["transfer"]["shares"] == 1
    assert shares["transfer"]["copy_ranges"] == single["transfer"]["copy_ranges"]
    assert len(shares["steps_s"]["share_walls"]) == shares["transfer"]["shares"]
    assert single["same_bytes_as_other_path"] and shares["same_bytes_as_other_path"]
    split.print_report(report)
    assert "shares" in capsys.readouterr().out


def test_commit_step_computing_and_stitching_the_coarse_levels_on_the_same_tiles(ctx):
    (row,) = commit_step.run([8192], 2, ctx.storage)
    assert (row["windows"], row["stages"], row["nodes"]) == (64, 2, 5)  # 2 x 2 nodes, then the last
    for part in ("commit_computing", "commit_staging_intermediates", "commit_stitching"):
        assert {"manifest", "tile_heads", "tile_levels", "coarse_levels", "check", "total"} <= set(row[part])
    assert "intermediates" in row["commit_stitching"] and "intermediates" not in row["commit_computing"]
    assert 0 < row["tree_wall_model_s"] <= row["tree_here_s"]
    for part in ("planning_heads_read_s", "planning_first_stage_heads_s", "planning_heads_carried_s"):
        assert row[part] > 0


def test_cpu_floor_encodes_every_window_and_runs_rio_both_ways_each_repeat():
    report = cpu_floor.run(512, 2)
    assert set(report["runs"]) == {"ours_encode_only", "rio", "rio_predictor"}
    for runs in report["runs"].values():
        assert len(runs) == 2 and all(r["cpu_s"] > 0 and r["bytes"] > 0 for r in runs)
    # One 512² window encoded: a tile of the scene, its bytes the encoder's, the same each time.
    assert len({r["bytes"] for r in report["runs"]["ours_encode_only"]}) == 1
    assert report["ratio_cpu"]["n"] == report["ratio_cpu_predictor"]["n"] == 2
