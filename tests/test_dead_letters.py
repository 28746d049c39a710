"""Dead-lettered BlobCreated events delivered again with ``python -m devhost replay-dead-letters``.

The dead-letter blobs are written here as Event Grid writes them (named by subscription and UTC
hour, each a JSON array of events in the EventGridSchema with the dead-letter fields added); the
uploads they announce are in the input container, and no event for them was ever delivered: the
replay's host does not watch the container, so every job here comes from a replayed event.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from .app_jobs import make_scene
from .test_cli import run_cli

pytestmark = pytest.mark.slow


def blob_created(blob, length: int) -> dict:
    """A BlobCreated event for ``blob`` as Event Grid delivers it, with the fields dead-lettering adds."""
    return {
        "id": str(uuid.uuid4()),
        "topic": "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/dev",
        "subject": f"/blobServices/default/containers/{blob.container_name}/blobs/{blob.blob_name}",
        "eventType": "Microsoft.Storage.BlobCreated",
        "eventTime": "2026-12-01T17:00:00.0000000Z",
        "dataVersion": "",
        "metadataVersion": "1",
        "data": {
            "api": "PutBlockList",
            "eTag": blob.get_blob_properties().etag,
            "contentType": "image/tiff",
            "contentLength": length,
            "blobType": "BlockBlob",
            "url": blob.url,
            "sequencer": "0000000000000000000000000000000000000000000000",
        },
        "deadLetterReason": "MaxDeliveryAttemptsExceeded",
        "deliveryAttempts": 30,
        "lastDeliveryOutcome": "Unavailable",
        "publishTime": "2026-12-01T17:00:00.1000000Z",
        "lastDeliveryAttemptTime": "2026-12-02T17:00:00.2000000Z",
    }


def test_three_dead_lettered_events_one_a_duplicate_become_two_jobs_and_one_duplicate(storage, app_env, tmp_path):
    blobs = storage.blob_service()
    inputs = blobs.get_container_client(app_env.input)
    inputs.create_container()
    events = []
    for name, width in (("first.tif", 300), ("second.tif", 340)):
        scene = make_scene(tmp_path / name, width, 260)
        inputs.upload_blob(name, scene.read_bytes())
        events.append(blob_created(inputs.get_blob_client(name), scene.stat().st_size))
    dead_letters = blobs.get_container_client(f"dl-{app_env.input}")
    dead_letters.create_container()
    # Event Grid's names: the subscription's name in upper case, then the UTC hour, not zero-padded.
    dead_letters.upload_blob(f"UPLOADS-TO-TRIGGER/2026/12/2/5/{uuid.uuid4()}.json", json.dumps([events[0]]))
    again = {**events[0], "id": str(uuid.uuid4())}  # the same upload announced twice (at least once)
    dead_letters.upload_blob(f"UPLOADS-TO-TRIGGER/2026/12/2/6/{uuid.uuid4()}.json", json.dumps([events[1], again]))

    env = {**os.environ, **app_env.env}
    args = ("replay-dead-letters", "--container", dead_letters.container_name, "--hub", app_env.hub)
    done = run_cli(env, *args)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["counts"] == {"started": 2, "duplicate": 1}, report
    assert report["skipped"] == [] and report["blobs_replayed"] == 2
    started = {d["blob"]: d["job_id"] for d in report["decisions"] if d["action"] == "started"}
    assert set(started) == {"first.tif", "second.tif"}
    duplicate = [d for d in report["decisions"] if d["action"] == "duplicate"]
    assert [(d["blob"], d["job_id"], d["event_id"]) for d in duplicate] == [
        ("first.tif", started["first.tif"], again["id"])
    ]
    assert report["jobs"] == {job_id: "Completed" for job_id in started.values()}
    mosaics = {b.name for b in blobs.get_container_client(app_env.output).list_blobs()}
    assert all(f"mosaics/{job_id}/mosaic.tif" in mosaics for job_id in started.values())

    markers = sorted(b.name for b in dead_letters.list_blobs(name_starts_with="replayed/"))
    assert len(markers) == 2  # the dead-letter blobs themselves stay, each with its marker

    again_run = run_cli(env, *args)
    assert again_run.returncode == 0, again_run.stderr
    second = json.loads(again_run.stdout)
    assert second["decisions"] == [] and second["already_replayed"] == 2


def test_an_event_that_is_not_an_upload_of_the_input_container_is_reported_not_delivered(storage, app_env, tmp_path):
    blobs = storage.blob_service()
    blobs.get_container_client(app_env.input).create_container()
    elsewhere = blobs.get_container_client(f"x-{app_env.input}")
    elsewhere.create_container()
    elsewhere.upload_blob("other.tif", b"not ours")
    dead_letters = blobs.get_container_client(f"dl-{app_env.input}")
    dead_letters.create_container()
    dead_letters.upload_blob(
        "SUB/2026/12/2/5/a.json", json.dumps([blob_created(elsewhere.get_blob_client("other.tif"), 8)])
    )
    done = run_cli(
        {**os.environ, **app_env.env},
        "replay-dead-letters",
        "--container",
        dead_letters.container_name,
        "--hub",
        app_env.hub,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["decisions"] == [] and len(report["skipped"]) == 1
    assert "is not a blob of the input container" in report["skipped"][0]["reason"]
    # An upload deleted since its event was dead-lettered: reported as failed, no marker, so a
    # later replay tries it again.
    inputs = blobs.get_container_client(app_env.input)
    inputs.upload_blob("gone.tif", b"II*\x00")
    gone = blob_created(inputs.get_blob_client("gone.tif"), 4)
    inputs.delete_blob("gone.tif")
    dead_letters.upload_blob("SUB/2026/12/2/6/b.json", json.dumps([gone]))
    env = {**os.environ, **app_env.env}
    args = ("replay-dead-letters", "--container", dead_letters.container_name, "--hub", app_env.hub)
    for _ in range(2):
        again = run_cli(env, *args)
        assert again.returncode == 1, again.stderr
        (decision,) = json.loads(again.stdout)["decisions"]
        assert decision["action"] == "failed" and decision["blob"] == "gone.tif", decision
        assert "ResourceNotFoundError" in decision["reason"]
    markers = [b.name for b in dead_letters.list_blobs(name_starts_with="replayed/")]
    assert markers == ["replayed/SUB/2026/12/2/5/a.json"]
    missing = run_cli(
        {**os.environ, **app_env.env}, "replay-dead-letters", "--container", "nosuchcontainer", "--hub", app_env.hub
    )
    assert missing.returncode == 2 and "no container 'nosuchcontainer'" in missing.stderr
