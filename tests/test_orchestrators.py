"""The orchestrators, driven by the real Durable SDK from hand-built history JSON."""

from __future__ import annotations

import json

import azure.durable_functions as df
import pytest
from azure.core.exceptions import HttpResponseError

from orchestrators import names, tiling, verify
from orchestrators.batches import GROUP_BATCHES, batch_instance_id
from tests.durable_history import History, leaf_actions
from tilecommit.errors import (
    BodyTooLargeError,
    CatalogCheckError,
    ConfigurationError,
    IncompleteManifestError,
    InvalidRasterError,
    MosaicCheckError,
    error_value,
)
from tilecommit.retries import ACTIVITY_RETRY
from tilecommit.spec import OutputSpec

JOB = {
    "job_id": "0123456789abcdef",
    "blob": "scene.tif",
    "url": "http://x/acct/in/scene.tif",
    "etag": "0x1",
    "size": 10,
    "spec": OutputSpec(window_size=1024).to_dict(),
    "batch_size": 4,
}
SCENE = {"width": 2500, "height": 1800}  # 3 x 2 windows of 1024
#: The job as the starter makes it since collections: it names the collection its item joins.
#: ``JOB`` is a payload from before, which ends after the assembly as it did then.
LISTED_JOB = {**JOB, "collection": "tilecommit"}


def error(exc: Exception, window: str | None = None) -> dict:
    """The value an activity returns for ``exc`` (:func:`tilecommit.errors.error_value`)."""
    return error_value(exc, window=window)


def run(fn, history: History) -> dict:
    return json.loads(df.Orchestrator.create(fn)(history.context()))


def run_failing(fn, history: History) -> str:
    """The failure message of an orchestration that fails in this episode. For a job
    (``tile_scene``) the failing episode first publishes the job's failed event
    (:func:`announced`); this completes that publish and runs the episode that ends the job."""
    if fn is tiling.tile_scene:
        history = announced(history, "failed")
    with pytest.raises(Exception) as info:
        df.Orchestrator.create(fn)(history.context())
    return str(info.value)


def next_task_id(history: History) -> int:
    """The id the SDK gives the next task: one per scheduled activity, timer and sub-orchestration."""
    return sum(1 for e in history.events if e["EventType"] in (4, 7, 10))


def announced(history: History, outcome: str, answer: dict | None = None) -> History:
    """Runs the episode that ends the job: it must schedule ``publish_job_event`` for ``outcome``
    (and nothing after it); then the publish's completion is added with ``answer``."""
    state = run(tiling.tile_scene, history)
    publish = leaf_actions(state)[-1]
    assert publish["functionName"] == names.PUBLISH_JOB_EVENT and state["isDone"] is False
    payload = json.loads(publish["input"])
    assert payload["outcome"] == outcome and payload["job"] == json.loads(history.input)
    task_id = next_task_id(history)
    history.scheduled(task_id, names.PUBLISH_JOB_EVENT).episode()
    return history.completed(task_id, answer or {"outcome": "published", "event_id": "e", "type": outcome})


#: What ``add_to_collection`` answers for the job (activities/catalog.py).
COLLECTED = {
    "collection": "tilecommit",
    "collection_blob": "collections/tilecommit/collection.json",
    "collection_url": "c",
    "index_blob": "collections/tilecommit/index/7a.json",
    "outcome": "written",
    "revision": 3,
    "conflicts": 1,
    "attempts": 3,
}


def catalogued(history: History, answer: dict | None = None) -> History:
    """Runs the episode after the assembly: it must schedule ``add_to_collection`` with the job
    (and nothing after it); then its completion is added with ``answer``."""
    state = run(tiling.tile_scene, history)
    add = leaf_actions(state)[-1]
    assert add["functionName"] == names.ADD_TO_COLLECTION and state["isDone"] is False
    assert json.loads(add["input"]) == {"job": json.loads(history.input)}
    assert state["customStatus"]["stage"] == "cataloguing"
    task_id = next_task_id(history)
    history.scheduled(task_id, names.ADD_TO_COLLECTION).episode()
    return history.completed(task_id, answer or COLLECTED)


def test_first_episode_validates_with_retry_and_reports_stage():
    state = run(tiling.tile_scene, History(names.TILE_SCENE, JOB))
    [action] = leaf_actions(state)
    assert action["actionType"] == 1  # CallActivityWithRetry
    assert action["functionName"] == names.VALIDATE_SOURCE
    assert json.loads(action["input"]) == JOB
    assert action["retryOptions"] == {
        "firstRetryIntervalInMilliseconds": 5000,
        "maxNumberOfAttempts": 6,
        "backoffCoefficient": 2.0,
        "maxRetryIntervalInMilliseconds": 60000,
    }
    assert state["customStatus"]["stage"] == "validating"
    assert state["isDone"] is False


def validated_history(job=JOB, scene=SCENE) -> History:
    history = History(names.TILE_SCENE, job).scheduled(0, names.VALIDATE_SOURCE).episode()
    return history.completed(0, {"scene": scene})


def test_plans_windows_and_fans_out_batches_as_sub_orchestrations():
    state = run(tiling.tile_scene, validated_history())
    actions = leaf_actions(state)[1:]
    assert [a["actionType"] for a in actions] == [2, 2]
    assert [a["instanceId"] for a in actions] == ["0123456789abcdef-batch-00000", "0123456789abcdef-batch-00001"]
    batches = [json.loads(a["input"]) for a in actions]
    ids = [f"{w['row']:04d}_{w['col']:04d}" for b in batches for w in b["windows"]]
    assert ids == ["0000_0000", "0000_0001", "0000_0002", "0001_0000", "0001_0001", "0001_0002"]
    assert [len(b["windows"]) for b in batches] == [4, 2]
    assert batches[1]["windows"][-1] == {
        "row": 1,
        "col": 2,
        "row_off": 1024,
        "col_off": 2048,
        "height": 776,
        "width": 452,
    }
    assert state["customStatus"] == {
        "stage": "tiling",
        "windows_done": 0,
        "windows_total": 6,
        "batches_done": 0,
        "batches_total": 2,
    }


def planned_window_ids(job: dict) -> list[str]:
    actions = leaf_actions(run(tiling.tile_scene, validated_history(job)))[1:]
    return [f"{w['row']:04d}_{w['col']:04d}" for a in actions for w in json.loads(a["input"])["windows"]]


def test_the_plan_is_made_to_the_jobs_window_size():
    """The window size comes from the job's spec (the orchestrator reads no settings): 1024 makes
    3 x 2 windows of the 2500 x 1800 scene, 512 makes 5 x 4."""
    assert len(planned_window_ids(JOB)) == 6
    assert len(planned_window_ids({**JOB, "spec": OutputSpec(window_size=512).to_dict()})) == 20


def test_a_job_payload_from_before_the_spec_plans_with_its_own_window_size():
    legacy = {k: v for k, v in JOB.items() if k != "spec"}
    assert planned_window_ids({**legacy, "window_size": 1024}) == planned_window_ids(JOB)
    assert len(planned_window_ids({**legacy, "window_size": 512})) == 20


def test_every_batch_is_started_in_one_compound_action_and_later_episodes_add_none():
    """On the extension's shim a top-level action is awaited before the next one is invoked, so
    all batches go out in the one WhenAny action; taking them as they finish adds no action."""
    job = {**JOB, "batch_size": 1}  # 6 batches of one window
    state = run(tiling.tile_scene, validated_history(job))
    top = state["actions"][0]
    assert [a["actionType"] for a in top] == [12, 11]  # WhenAll(validate with retry), WhenAny(batches)
    assert [a["instanceId"] for a in top[1]["compoundActions"]] == [
        batch_instance_id(job["job_id"], i) for i in range(6)
    ]
    # One batch finishes: nothing new is scheduled, and progress is reported.
    history = validated_history(job)
    for i in range(6):
        history.sub_created(i + 1, names.RENDER_BATCH, batch_instance_id(job["job_id"], i))
    history.episode().sub_completed(2, batch_summary(1, 1, 0, 100))
    state = run(tiling.tile_scene, history)
    assert len(state["actions"][0]) == 2 and len(leaf_actions(state)) == 7
    assert state["customStatus"]["windows_done"] == 1 and state["customStatus"]["batches_done"] == 1


def batch_summary(windows, written, present, nbytes, batches=1):
    return {
        "windows": windows,
        "written": written,
        "already_present": present,
        "skipped": present,
        "bytes": nbytes,
        "errors": [],
        "batches": batches,
    }


def test_fan_in_then_assembly_then_collection_then_summary():
    history = validated_history(LISTED_JOB)
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    # What each part used rides with its result; the job adds it all up (tilecommit/usage.py).
    tiles_used = {"functions": {"render_tile": {"executions": 4, "seconds": 2.0}}, "requests": {"blob.write": 4}}
    history.sub_completed(2, batch_summary(2, 2, 0, 200)).sub_completed(
        1, {**batch_summary(4, 3, 1, 400), "usage": tiles_used}
    )
    state = run(tiling.tile_scene, history)
    assemble = leaf_actions(state)[-1]
    assert assemble["functionName"] == names.ASSEMBLE_MOSAIC
    # It is given what the job used until now (for the cost its STAC item records) and the tiles' bytes.
    assert json.loads(assemble["input"]) == {"job": LISTED_JOB, "scene": SCENE, "tile_bytes": 600, "usage": tiles_used}
    assert state["customStatus"]["stage"] == "assembling" and state["customStatus"]["windows_done"] == 6

    assembly_used = {"functions": {"assemble_mosaic": {"executions": 1, "seconds": 1.5}}, "requests": {"blob.write": 3}}
    history.scheduled(3, names.ASSEMBLE_MOSAIC).episode().completed(
        3, {"outcome": "written", "mosaic_url": "m", "stac_url": "s", "quicklook_url": "q", "usage": assembly_used}
    )
    history = catalogued(history)
    publish = json.loads(leaf_actions(run(tiling.tile_scene, history))[-1]["input"])
    job_used = {
        "functions": {
            "render_tile": {"executions": 4, "seconds": 2.0},
            "assemble_mosaic": {"executions": 1, "seconds": 1.5},
        },
        "requests": {"blob.write": 7},
    }
    assert publish["usage"] == job_used
    answer = {"outcome": "published", "event_id": "e", "type": "completed", "cost": {"usd": 0.5}}
    state = run(tiling.tile_scene, announced(history, "completed", answer))
    assert state["isDone"] is True
    assert publish["result"] == {k: v for k, v in state["output"].items() if k != "cost"} and publish["error"] is None
    assert state["output"]["cost"] == {"usd": 0.5}  # the publish priced it (it reads the settings)
    assert publish["started_at"] < publish["ended_at"] and publish["duration_s"] > 0
    assert state["output"] == {
        "job_id": LISTED_JOB["job_id"],
        "source": "scene.tif",
        "spec": {"window_size": 1024, "block_size": 256, "profile": "default"},
        "windows": 6,
        "written": 5,
        "already_present": 1,
        "skipped": 1,
        "bytes": 600,
        "mosaic_outcome": "written",
        "mosaic_url": "m",
        "stac_url": "s",
        "quicklook_url": "q",
        "collection": COLLECTED,
        "usage": job_used,
        "cost": {"usd": 0.5},
    }
    assert state["customStatus"]["stage"] == "done"


def test_bad_input_fails_the_job_at_once_with_the_message():
    history = History(names.TILE_SCENE, JOB).scheduled(0, names.VALIDATE_SOURCE).episode()
    history.completed(0, {"error": error(InvalidRasterError("not a raster: zero bytes"))})
    message = run_failing(tiling.tile_scene, history)
    assert "bad input 'scene.tif': not a raster: zero bytes (InvalidRasterError)" in message
    state = json.loads(message.split("$OutOfProcData$:")[1])
    # Nothing scheduled after the refusal but the job's failed event.
    assert [a["functionName"] for a in leaf_actions(state)] == [names.VALIDATE_SOURCE, names.PUBLISH_JOB_EVENT]
    event = json.loads(leaf_actions(state)[-1]["input"])
    assert event["error"]["type"] == "BadInputFailure" and "not a raster: zero bytes" in event["error"]["message"]


def test_bad_window_in_a_batch_fails_the_job():
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    bad = error(InvalidRasterError("truncated TIFF"), "0000_0001")
    history.sub_completed(1, {**batch_summary(4, 3, 0, 300), "errors": [bad]})
    message = run_failing(tiling.tile_scene, history)
    assert "bad input 'scene.tif': window 0000_0001: truncated TIFF (InvalidRasterError)" in message


def test_a_batch_whose_tile_ran_out_of_retries_fails_the_job_saying_storage_stayed_unavailable():
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    history.sub_failed(1, "StorageFaultError: creating blob 'tiles/x/0000_0001.tif' failed (status 503)")
    message = run_failing(tiling.tile_scene, history)
    assert "rendering the tiles still failed after 6 attempts over 135 s of retries" in message
    assert "status 503" in message and "bad input" not in message


def test_render_batch_fans_out_one_activity_per_window_and_sums():
    windows = [{"row": 0, "col": c, "row_off": 0, "col_off": c * 1024, "height": 1024, "width": 1024} for c in range(3)]
    history = History(names.RENDER_BATCH, {"job": JOB, "windows": windows}, "b")
    state = run(tiling.render_batch, history)
    actions = leaf_actions(state)
    assert [a["functionName"] for a in actions] == [names.RENDER_TILE] * 3
    assert [json.loads(a["input"])["window"] for a in actions] == windows
    for i in range(3):
        history.scheduled(i, names.RENDER_TILE)
    history.episode()
    history.completed(1, {"window": "0000_0001", "outcome": "already-present", "skipped": True, "nbytes": 7})
    one = {"functions": {"render_tile": {"executions": 1, "seconds": 0.5}}, "requests": {"blob.write": 1}}
    history.completed(0, {"window": "0000_0000", "outcome": "written", "skipped": False, "nbytes": 5, "usage": one})
    history.completed(
        2, {"window": "0000_0002", "outcome": "already-present", "skipped": False, "nbytes": 6, "usage": one}
    )
    state = run(tiling.render_batch, history)
    assert state["output"] == {
        "windows": 3,
        "written": 1,
        "already_present": 2,
        "skipped": 1,
        "bytes": 18,
        "usage": {"functions": {"render_tile": {"executions": 2, "seconds": 1.0}}, "requests": {"blob.write": 2}},
        "errors": [],
        "batches": 1,
    }


def test_failed_activity_is_retried_then_fails_the_batch_after_the_last_timer():
    window = {"row": 0, "col": 0, "row_off": 0, "col_off": 0, "height": 8, "width": 8}
    history = History(names.RENDER_BATCH, {"job": JOB, "windows": [window]}, "b").scheduled(0, names.RENDER_TILE)
    attempts = ACTIVITY_RETRY.max_attempts
    # Attempt k: TaskFailed -> the host's TimerCreated/TimerFired -> a new TaskScheduled.
    task_id, next_id = 0, 1
    for attempt in range(1, attempts + 1):
        history.episode().failed(task_id, f"ServiceResponseError attempt {attempt}")
        state = run(tiling.render_batch, history)
        assert state["isDone"] is False  # still waiting for the retry timer
        history.timer_created(next_id).episode().timer_fired(next_id)
        if attempt < attempts:
            state = run(tiling.render_batch, history)
            assert state["isDone"] is False
            task_id = next_id + 1
            history.scheduled(task_id, names.RENDER_TILE)
            next_id += 2
    message = run_failing(tiling.render_batch, history)
    assert f"ServiceResponseError attempt {attempts}" in message


def test_a_validation_that_exhausts_its_retries_fails_the_job_saying_storage_stayed_unavailable():
    history = History(names.TILE_SCENE, JOB).scheduled(0, names.VALIDATE_SOURCE)
    task_id, next_id = 0, 1
    for attempt in range(1, ACTIVITY_RETRY.max_attempts + 1):
        history.episode().failed(task_id, f"503 ServerBusy attempt {attempt}")
        history.timer_created(next_id).episode().timer_fired(next_id)
        task_id, next_id = next_id + 1, next_id + 2
        if attempt < ACTIVITY_RETRY.max_attempts:
            history.scheduled(task_id, names.VALIDATE_SOURCE)
    message = run_failing(tiling.tile_scene, history)
    assert "validating the upload still failed after 6 attempts over 135 s of retries" in message
    assert "storage stayed unavailable or throttled" in message and "503 ServerBusy attempt 6" in message


def test_a_completed_job_whose_event_cannot_be_published_fails_saying_so():
    """A refusal of the topic (an error value: e.g. the role is missing) fails the completed job
    instead of ending it with nobody told; retries that run out say storage or the topic stayed
    unavailable."""
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    history.sub_completed(1, batch_summary(4, 4, 0, 400)).sub_completed(2, batch_summary(2, 2, 0, 200))
    history.scheduled(3, names.ASSEMBLE_MOSAIC).episode()
    history.completed(3, {"outcome": "written", "mosaic_url": "m", "stac_url": "s", "quicklook_url": "q"})
    refused = {"error": error(HttpResponseError("(Unauthorized) the principal lacks EventGrid Data Sender"))}
    history = announced(history, "completed", refused)
    with pytest.raises(Exception) as info:
        df.Orchestrator.create(tiling.tile_scene)(history.context())
    assert "failed, not retryable: (Unauthorized) the principal lacks EventGrid Data Sender" in str(info.value)


def test_a_failed_jobs_failure_stands_when_its_event_cannot_be_published():
    history = History(names.TILE_SCENE, JOB).scheduled(0, names.VALIDATE_SOURCE).episode()
    history.completed(0, {"error": error(InvalidRasterError("not a raster: zero bytes"))})
    history = announced(history, "failed", {"error": error(HttpResponseError("(Unauthorized) no role"))})
    with pytest.raises(Exception) as info:
        df.Orchestrator.create(tiling.tile_scene)(history.context())
    assert "bad input 'scene.tif': not a raster: zero bytes" in str(info.value) and "no role" not in str(info.value)


def test_replaying_the_same_history_gives_the_same_actions():
    history = validated_history({**JOB, "batch_size": 2})
    assert run(tiling.tile_scene, history) == run(tiling.tile_scene, history)


PUBLISHING_JOB = {**JOB, "publish": True}


def assembled_history(job: dict) -> History:
    history = validated_history(job)
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    history.sub_completed(1, batch_summary(4, 4, 0, 400)).sub_completed(2, batch_summary(2, 2, 0, 200))
    history.scheduled(3, names.ASSEMBLE_MOSAIC).episode()
    return history.completed(3, {"outcome": "written", "mosaic_url": "m", "stac_url": "s", "quicklook_url": "q"})


def test_a_job_started_with_a_catalog_publishes_its_item_before_its_event_which_carries_the_link():
    history = assembled_history(PUBLISHING_JOB)
    state = run(tiling.tile_scene, history)
    item = leaf_actions(state)[-1]
    assert item["functionName"] == names.PUBLISH_ITEM and item["actionType"] == 1  # with the retry policy
    assert json.loads(item["input"]) == {"job": PUBLISHING_JOB} and state["customStatus"]["stage"] == "publishing"
    published = {"state": "published", "collection": "c", "item_id": JOB["job_id"], "url": "u", "outcome": "written"}
    history.scheduled(4, names.PUBLISH_ITEM).episode().completed(4, published)
    event = leaf_actions(run(tiling.tile_scene, history))[-1]
    assert event["functionName"] == names.PUBLISH_JOB_EVENT
    assert json.loads(event["input"])["result"]["published"] == published
    state = run(tiling.tile_scene, announced(history, "completed"))
    assert state["isDone"] is True and state["output"]["published"] == published


def test_a_job_started_without_a_catalog_goes_from_its_mosaic_to_its_event():
    state = run(tiling.tile_scene, assembled_history(JOB))
    assert leaf_actions(state)[-1]["functionName"] == names.PUBLISH_JOB_EVENT


def test_an_item_the_catalog_holds_otherwise_fails_the_job_after_its_mosaic():
    history = assembled_history(PUBLISHING_JOB)
    history.scheduled(4, names.PUBLISH_ITEM).episode()
    history.completed(4, {"error": error(CatalogCheckError("pgstac holds another item"))})
    # The job fails for what the catalog holds, and its failed event still goes out.
    publish = leaf_actions(run(tiling.tile_scene, history))[-1]
    assert publish["functionName"] == names.PUBLISH_JOB_EVENT
    assert "pgstac holds another item" in json.loads(publish["input"])["error"]["message"]


def test_a_mosaic_that_fails_its_checks_fails_the_job():
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    history.sub_completed(1, batch_summary(4, 4, 0, 400)).sub_completed(2, batch_summary(2, 2, 0, 200))
    history.scheduled(3, names.ASSEMBLE_MOSAIC).episode()
    history.completed(3, {"error": error(MosaicCheckError("2 levels, 3 expected"))})
    assert "mosaic check failed: 2 levels, 3 expected" in run_failing(tiling.tile_scene, history)


def test_a_job_from_before_collections_ends_after_its_assembly_as_it_did():
    """A payload without ``collection`` was started by a release whose job published its event
    right after the assembly: replaying its history must ask for the same actions, so it is not
    listed (tests/test_replay_history.py replays recorded ones)."""
    history = assembly_answered({"outcome": "written", "mosaic_url": "m", "stac_url": "s", "quicklook_url": "q"})
    state = run(tiling.tile_scene, announced(history, "completed"))
    assert state["isDone"] is True and "collection" not in state["output"]
    assert names.ADD_TO_COLLECTION not in [a["functionName"] for a in leaf_actions(state)]


def test_an_item_its_collection_lists_otherwise_fails_the_job_as_a_check_and_it_is_announced():
    """The collection's index lists the item with another entry (known bad): the job fails with
    the check's wording, after its failed event."""
    history = tiled_history(LISTED_JOB).scheduled(3, names.ASSEMBLE_MOSAIC).episode()
    history.completed(3, {"outcome": "written", "mosaic_url": "m", "stac_url": "s", "quicklook_url": "q"})
    listed = MosaicCheckError("collections/tilecommit/index/7a.json lists item 7a otherwise than its stored item gives")
    message = run_failing(tiling.tile_scene, catalogued(history, {"error": error(listed)}))
    assert "mosaic check failed: collections/tilecommit/index/7a.json lists item 7a otherwise" in message


@pytest.mark.parametrize(
    "exc",
    [ConfigurationError("tilecommit_profile 'gif': expected one of default, zstd"), BodyTooLargeError("6 GB")],
    ids=["ConfigurationError", "BodyTooLargeError"],
)
def test_every_bad_input_error_is_worded_as_bad_input_by_its_kind_not_its_name(exc):
    """The orchestrator reads the error value's kind; no list of type names to keep up to date."""
    history = History(names.TILE_SCENE, JOB).scheduled(0, names.VALIDATE_SOURCE).episode()
    history.completed(0, {"error": error(exc)})
    assert f"bad input 'scene.tif': {exc} ({type(exc).__name__})" in run_failing(tiling.tile_scene, history)


def test_the_kind_decides_the_wording_whatever_the_type_is_called():
    renamed = {**error(MosaicCheckError("2 levels, 3 expected")), "type": "SomeNewCheckError"}
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    history.sub_completed(1, batch_summary(4, 4, 0, 400)).sub_completed(2, batch_summary(2, 2, 0, 200))
    history.scheduled(3, names.ASSEMBLE_MOSAIC).episode()
    history.completed(3, {"error": renamed})
    assert "mosaic check failed: 2 levels, 3 expected (SomeNewCheckError)" in run_failing(tiling.tile_scene, history)


def test_an_error_value_without_a_kind_from_an_older_release_is_a_fault():
    old = {"type": "InvalidRasterError", "message": "not a raster: zero bytes", "window": None}
    history = History(names.TILE_SCENE, JOB).scheduled(0, names.VALIDATE_SOURCE).episode()
    history.completed(0, {"error": old})
    message = run_failing(tiling.tile_scene, history)
    assert "failed, not retryable: not a raster: zero bytes" in message and "bad input" not in message


def validation_answered(answer: dict) -> History:
    history = History(names.TILE_SCENE, JOB).scheduled(0, names.VALIDATE_SOURCE).episode()
    return history.completed(0, answer)


def assembly_answered(answer: dict) -> History:
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    history.sub_completed(1, batch_summary(4, 4, 0, 400)).sub_completed(2, batch_summary(2, 2, 0, 200))
    return history.scheduled(3, names.ASSEMBLE_MOSAIC).episode().completed(3, answer)


def batch_failed(reason: str) -> History:
    history = validated_history()
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    return history.sub_failed(1, reason)


@pytest.mark.parametrize(
    ("history", "failure"),
    [
        (lambda: validation_answered({"error": error(InvalidRasterError("zero bytes"))}), "BadInputFailure"),
        (lambda: validation_answered({"error": error(HttpResponseError("(Forbidden) no role"))}), "FaultFailure"),
        (lambda: assembly_answered({"error": error(MosaicCheckError("2 levels, 3 expected"))}), "MosaicFailure"),
        (lambda: batch_failed("StorageFaultError: status 503"), "RetriesExhaustedFailure"),
    ],
    ids=["bad input", "fault", "check", "retries exhausted"],
)
def test_the_failed_event_and_telemetry_name_the_failure_for_what_happened(history, failure):
    """The failure's class name is what the job's failed event and its telemetry show."""
    publish = leaf_actions(run(tiling.tile_scene, history()))[-1]
    assert publish["functionName"] == names.PUBLISH_JOB_EVENT
    assert json.loads(publish["input"])["error"]["type"] == failure


BIG_JOB = {**JOB, "spec": OutputSpec(window_size=256).to_dict(), "batch_size": 2}
BIG_SCENE = {"width": 2048, "height": 1536}  # 8 x 6 = 48 windows, 24 batches of 2: more than one group


def test_large_scenes_fan_out_groups_of_batches_so_the_job_history_stays_bounded():
    state = run(tiling.tile_scene, validated_history(BIG_JOB, BIG_SCENE))
    groups = leaf_actions(state)[1:]
    assert [a["functionName"] for a in groups] == [names.RENDER_GROUP] * 2
    assert [a["instanceId"] for a in groups] == ["0123456789abcdef-group-0000", "0123456789abcdef-group-0001"]
    inputs = [json.loads(a["input"]) for a in groups]
    assert [(i["first_batch"], i["batch_count"]) for i in inputs] == [(0, GROUP_BATCHES), (16, 8)]
    assert inputs[0]["scene"] == BIG_SCENE and inputs[0]["job"] == BIG_JOB
    assert state["customStatus"]["batches_total"] == 24 and state["customStatus"]["windows_total"] == 48

    history = validated_history(BIG_JOB, BIG_SCENE)
    history.sub_created(1, names.RENDER_GROUP, "g0").sub_created(2, names.RENDER_GROUP, "g1").episode()
    history.sub_completed(2, batch_summary(16, 16, 0, 1600, batches=8))
    state = run(tiling.tile_scene, history)
    assert state["customStatus"]["windows_done"] == 16 and state["customStatus"]["batches_done"] == 8


def test_render_group_runs_its_own_batches_and_sums_them():
    group = {"job": BIG_JOB, "scene": BIG_SCENE, "first_batch": 16, "batch_count": 8}
    history = History(names.RENDER_GROUP, group, "g1")
    state = run(tiling.render_group, history)
    actions = leaf_actions(state)
    assert [a["instanceId"] for a in actions] == [batch_instance_id(JOB["job_id"], i) for i in range(16, 24)]
    first = json.loads(actions[0]["input"])["windows"]
    # Batch 16 holds windows 32 and 33 of the row-major plan: row 4, columns 0 and 1.
    assert [(w["row"], w["col"]) for w in first] == [(4, 0), (4, 1)]
    for i in range(8):
        history.sub_created(i, names.RENDER_BATCH, actions[i]["instanceId"])
    history.episode()
    for i in range(4):
        history.sub_completed(i, batch_summary(2, 1, 1, 10))
    state = run(tiling.render_group, history)
    assert len(leaf_actions(state)) == 8 and not state["isDone"]
    history.episode()
    batch_used = {"functions": {"render_tile": {"executions": 2, "seconds": 1.0}}}
    for i in range(4, 8):
        history.sub_completed(i, {**batch_summary(2, 2, 0, 20), "usage": batch_used})
    state = run(tiling.render_group, history)
    assert state["output"] == {
        "windows": 16,
        "written": 12,
        "already_present": 4,
        "skipped": 4,
        "bytes": 120,
        "usage": {"functions": {"render_tile": {"executions": 8, "seconds": 4.0}}},
        "errors": [],
        "batches": 8,
    }


def tiled_history(job: dict) -> History:
    """The job validated and its two batches done, 600 bytes of tiles recorded."""
    history = validated_history(job)
    history.sub_created(1, names.RENDER_BATCH, "a").sub_created(2, names.RENDER_BATCH, "b").episode()
    return history.sub_completed(2, batch_summary(2, 2, 0, 200)).sub_completed(1, batch_summary(4, 3, 1, 400))


#: What the assembly is given besides the job, the scene and the shares: the tiles' bytes and what
#: the job used before it (these histories' results carry no usage), for its STAC item's cost.
USED_BEFORE = {"tile_bytes": 600, "usage": {}}
PLANNED = {"name": "plans/x/ab12C.json", "etag": "0x9", "tag": "ab12C", "shares": 3, "ranges": 30, "copied_bytes": 590}


def test_tiles_over_one_share_are_planned_staged_in_shares_at_once_then_committed_by_the_assembly():
    job = {**JOB, "assembly_share_bytes": 500}  # 600 bytes of tiles: more than one share
    history = tiled_history(job)
    (plan,) = leaf_actions(run(tiling.tile_scene, history))[-1:]
    assert plan["functionName"] == names.PLAN_MOSAIC_SHARES
    planned_input = json.loads(plan["input"])
    # No attempt id: the plan (and its block ids) is named by the tiles it copies.
    assert planned_input == {"job": job, "scene": planned_input["scene"], "share_bytes": 500}
    assert json.loads(leaf_actions(run(tiling.tile_scene, tiled_history(job)))[-1]["input"]) == planned_input

    history.scheduled(3, names.PLAN_MOSAIC_SHARES).episode().completed(3, {"shares": PLANNED})
    state = run(tiling.tile_scene, history)
    stages = leaf_actions(state)[-3:]
    assert [a["functionName"] for a in stages] == [names.STAGE_MOSAIC_SHARE] * 3
    assert [json.loads(a["input"])["share"] for a in stages] == [0, 1, 2]
    whenany = state["actions"][0][-1]  # every share in one compound action: started at once
    assert whenany["actionType"] == 11 and len(whenany["compoundActions"]) == 3
    assert state["customStatus"]["shares_total"] == 3

    for event_id in (4, 5, 6):
        history.scheduled(event_id, names.STAGE_MOSAIC_SHARE)
    history.episode()
    for event_id in (6, 4, 5):
        history.completed(event_id, {"share": event_id - 4, "staged": 10, "stopped": False})
    commit = leaf_actions(run(tiling.tile_scene, history))[-1]
    assert commit["functionName"] == names.ASSEMBLE_MOSAIC
    assert json.loads(commit["input"]) == {"job": job, "scene": SCENE, "shares": PLANNED, **USED_BEFORE}


def test_tiles_within_one_share_go_straight_to_the_one_activity_assembly():
    job = {**JOB, "assembly_share_bytes": 600}
    assemble = leaf_actions(run(tiling.tile_scene, tiled_history(job)))[-1]
    assert assemble["functionName"] == names.ASSEMBLE_MOSAIC
    assert json.loads(assemble["input"]) == {"job": job, "scene": SCENE, **USED_BEFORE}


def test_a_share_that_found_a_tile_changed_fails_the_job_naming_the_window():
    job = {**JOB, "assembly_share_bytes": 500}
    history = tiled_history(job).scheduled(3, names.PLAN_MOSAIC_SHARES).episode().completed(3, {"shares": PLANNED})
    for event_id in (4, 5, 6):
        history.scheduled(event_id, names.STAGE_MOSAIC_SHARE)
    changed = error(
        IncompleteManifestError(
            "window 0001_0002: tile t changed after its manifest row was written", mismatched=["0001_0002"]
        )
    )
    history.episode().completed(5, {"error": changed})
    message = run_failing(tiling.tile_scene, history)
    assert "failed, not retryable: window 0001_0002: tile t changed after its manifest row" in message


def test_a_plan_that_says_single_and_a_service_without_copy_from_url_fall_back_to_one_activity():
    job = {**JOB, "assembly_share_bytes": 500}
    single = tiled_history(job).scheduled(3, names.PLAN_MOSAIC_SHARES).episode()
    single.completed(3, {"single": "the mosaic exists already"})
    assert json.loads(leaf_actions(run(tiling.tile_scene, single))[-1]["input"]) == {
        "job": job,
        "scene": SCENE,
        **USED_BEFORE,
    }

    history = tiled_history(job).scheduled(3, names.PLAN_MOSAIC_SHARES).episode().completed(3, {"shares": PLANNED})
    for event_id in (4, 5, 6):
        history.scheduled(event_id, names.STAGE_MOSAIC_SHARE)
    history.episode()
    for event_id in (4, 5, 6):
        history.completed(event_id, {"share": event_id - 4, "staged": 0, "unsupported": "Put Block From URL: 501"})
    commit = leaf_actions(run(tiling.tile_scene, history))[-1]
    assert json.loads(commit["input"]) == {"job": job, "scene": SCENE, **USED_BEFORE}


VERIFY_ID = "0123456789abcdef-verify-1"


def verify_validated(scene: dict, repair: bool = True) -> History:
    history = History(names.VERIFY_SCENE, {"job": BIG_JOB, "repair": repair}, VERIFY_ID)
    return history.scheduled(0, names.VALIDATE_SOURCE).episode().completed(0, {"scene": scene})


def test_a_scrub_of_a_large_scene_fans_out_groups_named_after_the_scrub():
    state = run(verify.verify_scene, verify_validated(BIG_SCENE))
    groups = leaf_actions(state)[1:]
    assert [a["functionName"] for a in groups] == [names.VERIFY_GROUP] * 2
    assert [a["instanceId"] for a in groups] == [f"{VERIFY_ID}-group-0000", f"{VERIFY_ID}-group-0001"]
    assert [json.loads(a["input"]) for a in groups] == [
        {
            "job": BIG_JOB,
            "repair": True,
            "verify_id": VERIFY_ID,
            "scene": BIG_SCENE,
            "first_batch": 0,
            "batch_count": 16,
        },
        {
            "job": BIG_JOB,
            "repair": True,
            "verify_id": VERIFY_ID,
            "scene": BIG_SCENE,
            "first_batch": 16,
            "batch_count": 8,
        },
    ]
    assert state["customStatus"] == {"stage": "verifying", "windows_done": 0, "windows_total": 48}


def test_verify_group_runs_its_own_batches_and_verify_batch_keeps_only_the_differences():
    group = {"job": BIG_JOB, "repair": False, "verify_id": VERIFY_ID, "scene": BIG_SCENE, "first_batch": 16}
    history = History(names.VERIFY_GROUP, {**group, "batch_count": 8}, f"{VERIFY_ID}-group-0001")
    actions = leaf_actions(run(verify.verify_group, history))
    assert [a["instanceId"] for a in actions] == [f"{VERIFY_ID}-batch-{i:05d}" for i in range(16, 24)]
    first = json.loads(actions[0]["input"])
    assert list(first) == ["job", "repair", "windows"] and first["repair"] is False
    assert [(w["row"], w["col"]) for w in first["windows"]] == [(4, 0), (4, 1)]

    batch = History(names.VERIFY_BATCH, first, actions[0]["instanceId"])
    windows = leaf_actions(run(verify.verify_batch, batch))
    assert [json.loads(a["input"]) for a in windows] == [
        {"job": BIG_JOB, "repair": False, "window": w} for w in first["windows"]
    ]
    batch.scheduled(0, names.VERIFY_WINDOW).scheduled(1, names.VERIFY_WINDOW).episode()
    differing = {"window": "0004_0001", "differences": ["tile missing"]}
    batch.completed(0, {"window": "0004_0000", "differences": []}).completed(1, differing)
    assert run(verify.verify_batch, batch)["output"] == {
        "windows": 2,
        "batches": 1,
        "reports": [differing],
        "errors": [],
    }
