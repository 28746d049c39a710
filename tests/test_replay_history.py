"""Orchestrations started by an earlier release replay and complete under today's code.

Each file of ``tests/fixtures/replay/`` holds the Durable history of real runs on the local host
(``tests/record_replay_history.py`` wrote it; the code that recorded it is named in the file):
a job of two batches, a job whose batches are grouped, and a scrub; ``jobs.json`` from before
orchestration versions (version 1), ``jobs-2.0.json`` of version 2.0, whose job asks for its
batches with its version (:mod:`orchestrators.versions`), ``jobs-3.0.json`` of version 3.0, whose
grouped job runs its coarse levels' reduction tree before the commit, ``jobs-4.0.json`` of version
4.0, which adds a small job with a tree, one tile lost, and a scrub whose repair runs the tree
before it rebuilds the mosaic. Each episode is replayed here
through the real SDK, as the host would after an upgrade with the instance stopped at that point:
the orchestrator registered in ``function_app`` under the recorded name must ask for the very
actions history holds (kind, name, instance id, retry options, input), set the same custom
status, and end with the recorded output. The job payload every step is handed is the one the
orchestration was started with, key for key and in the same order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devhost.durable.functions import FunctionIndex
from devhost.durable.history import (
    EXECUTION_STARTED,
    EXECUTION_TERMINATED,
    ORCHESTRATOR_STARTED,
    SUB_ORCHESTRATION_COMPLETED,
    SUB_ORCHESTRATION_FAILED,
    TASK_COMPLETED,
    TASK_FAILED,
    TIMER_FIRED,
    flatten_actions,
)
from orchestrators import names, versions

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "replay").glob("*.json"))
#: Events the host hands the orchestrator at the start of an episode; the rest of an episode's
#: events are what it appended after (scheduled tasks, the end of the execution).
INCOMING = {
    ORCHESTRATOR_STARTED,
    EXECUTION_STARTED,
    EXECUTION_TERMINATED,
    TASK_COMPLETED,
    TASK_FAILED,
    SUB_ORCHESTRATION_COMPLETED,
    SUB_ORCHESTRATION_FAILED,
    TIMER_FIRED,
}

RECORDED = {fixture.stem: json.loads(fixture.read_text()) for fixture in FIXTURES}
INSTANCES = [
    pytest.param(instance, id=f"{stem}:{orchestration['label']}:{instance['name']}:{instance['id'][-10:]}")
    for stem, recorded in RECORDED.items()
    for orchestration in recorded["orchestrations"]
    for instance in orchestration["instances"]
]


@pytest.fixture(scope="module")
def index() -> FunctionIndex:
    return FunctionIndex.load("function_app")


def incoming(episode: dict) -> list[dict]:
    events = episode["events"]
    count = next((i for i, e in enumerate(events) if e["EventType"] not in INCOMING), len(events))
    assert all(e["EventType"] not in INCOMING for e in events[count:]), "history out of the host's order"
    return events[:count]


def replay(index: FunctionIndex, instance: dict, past: list[dict], new: list[dict]) -> dict:
    context = {
        "history": past + new,
        "instanceId": instance["id"],
        "isReplaying": bool(past),
        "parentInstanceId": instance["parent"],
        "input": instance["input"],
        "upperSchemaVersion": 1,
        "upperSchemaVersionNew": 2,
    }
    return json.loads(index.orchestrator(instance["name"])(json.dumps(context)))


def comparable(action: dict) -> dict:
    """An action with its input parsed: the extension keeps the input, never compares its text."""
    return {**action, "input": json.loads(action["input"]) if action.get("input") else None}


def job_of(payload: dict) -> dict:
    """The job inside an orchestration's or a step's input (a job's own input is the job)."""
    return payload.get("job", payload)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda path: path.stem)
def test_each_fixture_holds_flat_grouped_and_verify_orchestrations_of_every_kind(fixture):
    recorded = RECORDED[fixture.stem]
    kinds = {
        instance["name"] for orchestration in recorded["orchestrations"] for instance in orchestration["instances"]
    }
    assert kinds == {names.TILE_SCENE, names.RENDER_GROUP, names.RENDER_BATCH, names.VERIFY_SCENE, names.VERIFY_BATCH}
    # Version 3.0's grouped job adds its coarse levels' nine reduction nodes (about 55 KB), 4.0's
    # tree job and its repair about 120 KB.
    assert fixture.stat().st_size < 500_000


def test_the_fixtures_are_of_version_1_and_of_this_release_s_version():
    def started_versions(recorded: dict) -> set:
        return {
            event.get("Version")
            for orchestration in recorded["orchestrations"]
            for instance in orchestration["instances"]
            for event in instance["episodes"][0]["events"]
            if event["EventType"] == EXECUTION_STARTED
        }

    assert started_versions(RECORDED["jobs"]) == {""}
    assert started_versions(RECORDED[f"jobs-{versions.CURRENT}"]) == {versions.CURRENT}


@pytest.mark.parametrize("instance", INSTANCES)
def test_every_episode_replays_to_the_recorded_actions_and_status_and_the_last_completes(index, instance):
    past: list[dict] = []
    recorded: list[dict] = []
    for number, episode in enumerate(instance["episodes"], start=1):
        state = replay(index, instance, past, incoming(episode))
        recorded += episode["actions"]
        actions = flatten_actions(state["actions"])
        assert [comparable(a) for a in actions] == [comparable(a) for a in recorded], f"episode {number}"
        assert state.get("customStatus") == episode["custom_status"], f"episode {number}"
        assert state["isDone"] is (number == len(instance["episodes"])), f"episode {number}"
        past += episode["events"]
    assert state["output"] == instance["output"]


@pytest.mark.parametrize("instance", INSTANCES)
def test_every_step_is_handed_the_job_payload_the_orchestration_started_with_unchanged(index, instance):
    started = job_of(json.loads(instance["input"]))
    *earlier, last = instance["episodes"]
    state = replay(index, instance, [e for episode in earlier for e in episode["events"]], incoming(last))
    handed = [job_of(json.loads(action["input"])) for action in flatten_actions(state["actions"])]
    assert handed and all(list(job.items()) == list(started.items()) for job in handed)
