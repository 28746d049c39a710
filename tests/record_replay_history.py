"""Record the Durable history of small jobs run end to end on the local host, for
``tests/test_replay_history.py``: an orchestration started by one release must replay and
complete under the next, so the fixture is written once by the code of its day and kept.

    .venv/bin/python -m tests.record_replay_history [tests/fixtures/replay/jobs.json]

The orchestrations, each with its sub-orchestrations: a job of two batches (flat), a job of
more batches than one level holds (grouped), a scrub of the first job, and (from version 4.0's
file on) a small job whose mosaic has a coarse-level reduction tree, one of its tiles deleted,
and a scrub that repairs it (running the tree before it rebuilds the mosaic). Each instance keeps
its input, its episodes as the host committed them (history events, the leaf actions the shim
invoked) and the custom status the orchestrator set in each episode, read from the state the
SDK returned to the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from azure.storage.blob import BlobServiceClient

from devhost.azurite import Azurite
from devhost.durable.host import HostOptions, LocalHost
from devhost.session import process_file
from devhost.verify import verify_job
from testkit.scenes import SceneSpec, write_scene
from tilecommit import jobs
from tilecommit import settings as names
from tilecommit.grid import plan_windows

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "replay" / "jobs.json"
WINDOW = 256


def app_settings(connection_string: str, label: str, batch_size: int) -> dict[str, str]:
    suffix = hashlib.sha256(label.encode()).hexdigest()[:10]
    return {
        names.STORAGE_CONNECTION: connection_string,
        names.SETTING_INPUT_CONTAINER: f"in-{suffix}",
        names.SETTING_TILES_CONTAINER: f"tiles-{suffix}",
        names.SETTING_OUTPUT_CONTAINER: f"out-{suffix}",
        names.SETTING_MANIFEST_TABLE: f"manifest{suffix}",
        names.SETTING_WINDOW_SIZE: str(WINDOW),
        names.SETTING_BATCH_SIZE: str(batch_size),
    }


def local_host(settings: dict[str, str], hub: str) -> LocalHost:
    """A local host of these app settings (set in the environment, where the app reads them; this
    script runs once and exits, so nothing is restored)."""
    os.environ.update(settings)
    return LocalHost(HostOptions(hub=hub, timer_scale=0.01, watch_interval=0.1))


def watch_custom_status(host: LocalHost) -> dict[str, list]:
    """Wrap the host's orchestrators: each episode's custom status, by instance, in order."""
    seen: dict[str, list] = {}

    def watched(run: Callable[[str], str]) -> Callable[[str], str]:
        def orchestrator(context_json: str) -> str:
            instance_id = json.loads(context_json)["instanceId"]
            state = run(context_json)  # a failing orchestrator raises: no job here fails
            seen.setdefault(instance_id, []).append(json.loads(state).get("customStatus"))
            return state

        return orchestrator

    for name, run in list(host.index.orchestrators.items()):
        host.index.orchestrators[name] = watched(run)
    return seen


def instance_record(host: LocalHost, instance_id: str, statuses: list) -> dict:
    state = host.store.read_state(instance_id)
    episodes = list(host.store.episodes(instance_id))
    if state is None or state["status"] != "Completed" or len(statuses) != len(episodes):
        raise RuntimeError(f"{instance_id}: not one completed run of one call per episode: {state}")
    return {
        "id": instance_id,
        "name": state["name"],
        "parent": state["parent"]["id"] if state.get("parent") else None,
        "input": state["input"],
        "output": state["output"],
        "episodes": [
            {"events": ep.events, "actions": ep.actions, "custom_status": status}
            for ep, status in zip(episodes, statuses, strict=True)
        ],
    }


def family(host: LocalHost, root: str, seen: dict[str, list]) -> list[dict]:
    """The instance ``root`` and every sub-orchestration under it, parents first."""
    children: dict[str, list[str]] = {}
    for state in host.store.instances():
        if state.get("parent"):
            children.setdefault(state["parent"]["id"], []).append(state["id"])
    order, queue = [], [root]
    while queue:
        instance_id = queue.pop(0)
        order.append(instance_id)
        queue += sorted(children.get(instance_id, []))
    return [instance_record(host, i, seen[i]) for i in order]


def delete_first_tile(azurite: Azurite, settings: dict[str, str], job_id: str, scene: SceneSpec) -> None:
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    tiles = service.get_container_client(settings[names.SETTING_TILES_CONTAINER])
    tiles.delete_blob(jobs.tile_blob_name(job_id, plan_windows(scene.width, scene.height, WINDOW)[0]))


def run_job(
    azurite: Azurite, label: str, scene: SceneSpec, batch_size: int, folder: Path, *, verify: bool, repair: bool = False
) -> list:
    settings = app_settings(azurite.connection_string, label, batch_size)
    hub = "Replay" + hashlib.sha256(label.encode()).hexdigest()[:8]
    with local_host(settings, hub) as host:
        seen = watch_custom_status(host)
        path = Path(write_scene(str(folder / f"{label}.tif"), scene))
        summary = process_file(host, path, timeout=300)
        if summary["status"] != "completed":
            raise RuntimeError(f"{label}: {summary}")
        recorded = [{"label": label, "instances": family(host, summary["job_id"], seen)}]
        if verify:
            if repair:
                delete_first_tile(azurite, settings, summary["job_id"], scene)
            scrub = verify_job(host, summary["job_id"], repair=repair, timeout=300)
            if scrub["status"] != "completed":
                raise RuntimeError(f"{label} verify: {scrub}")
            recorded.append({"label": f"{label}-verify", "instances": family(host, scrub["verify_id"], seen)})
    return recorded


def main(argv: list[str]) -> None:
    target = Path(argv[0]) if argv else FIXTURE
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with Azurite() as azurite, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        orchestrations = run_job(
            azurite, "flat", SceneSpec(520, 300, blocksize=WINDOW), batch_size=4, folder=folder, verify=True
        )
        # More batches than one level holds (orchestrators' GROUP_BATCHES, 16): 17 of one window.
        orchestrations += run_job(
            azurite, "grouped", SceneSpec(17 * WINDOW, 200, blocksize=WINDOW), batch_size=1, folder=folder, verify=False
        )
        # The smallest scene whose mosaic has a reduction tree (two nodes, then one): its scrub's
        # repair runs the tree before the rebuild.
        orchestrations += run_job(
            azurite,
            "tree-repaired",
            SceneSpec(5 * WINDOW, WINDOW, blocksize=WINDOW),
            batch_size=4,
            folder=folder,
            verify=True,
            repair=True,
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fixture = {"recorded_by": commit.stdout.strip(), "orchestrations": orchestrations}
    target.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"{target}: {target.stat().st_size} bytes, {sum(len(o['instances']) for o in orchestrations)} instances")


if __name__ == "__main__":
    main(sys.argv[1:])
