"""Completion events: their ids and shape, the local topic that keeps them, and a job's events
end to end on the local host (``--events-file``)."""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
from azure.core.exceptions import ClientAuthenticationError
from azure.core.messaging import CloudEvent

from devhost.durable.event_sink import FORWARD_TRIES, EventSink
from tilecommit import events
from tilecommit.jobs import Job
from tilecommit.settings import SETTING_EVENTS_KEY
from tilecommit.spec import OutputSpec

from .app_jobs import make_scene
from .test_cli import run_cli

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "schemas" / "cloudevents-1.0.json").read_text())


def check_cloud_event(raw: dict) -> None:
    """Valid CloudEvents 1.0 JSON (the schema), with an RFC 3339 time and a URI source."""
    jsonschema.validate(raw, SCHEMA)
    assert datetime.fromisoformat(raw["time"]).tzinfo is not None
    assert raw["source"].startswith(("http://", "https://"))


JOB = Job(
    job_id="0123456789abcdef",
    blob="a/scene.tif",
    url="http://127.0.0.1:1/dev/raster-uploads/a/scene.tif",
    etag="0x1",
    size=1,
    spec=OutputSpec(),
    batch_size=64,
)


def event(outcome: str = "completed", started_at: str = "2026-12-01T10:00:00+00:00") -> dict:
    return events.job_event(
        JOB, outcome=outcome, started_at=started_at, ended_at="2026-12-01T10:01:00+00:00", duration_s=60.0
    )


def test_one_ending_of_one_run_of_a_job_has_one_id():
    assert event()["id"] == event()["id"]  # a retried publish, an activity run twice
    assert event("failed")["id"] != event()["id"]
    assert event(started_at="2026-12-01T11:00:00+00:00")["id"] != event()["id"]  # the job run again
    with pytest.raises(ValueError, match="expected completed or failed"):
        event("cancelled")


def test_the_event_is_a_cloud_event_the_sdk_reads_back():
    raw = event()
    check_cloud_event(raw)
    with pytest.raises(jsonschema.ValidationError):  # the schema does refuse what is not one
        jsonschema.validate({**raw, "specversion": "0.3"}, SCHEMA)
    parsed = CloudEvent.from_dict(raw)
    assert (parsed.type, parsed.subject, parsed.source) == (
        events.COMPLETED,
        "a/scene.tif",
        "http://127.0.0.1:1/dev/raster-uploads",
    )
    assert raw["specversion"] == "1.0" and raw["datacontenttype"] == "application/json"
    assert raw["data"]["upload"] == {"blob": "a/scene.tif", "url": JOB.url, "etag": "0x1"}
    assert raw["data"]["spec"] == OutputSpec().to_dict()


@pytest.fixture
def sink_env(monkeypatch):
    def use(sink: EventSink) -> EventSink:
        monkeypatch.setenv(SETTING_EVENTS_KEY, sink.key)
        return sink

    return use


def test_the_local_topic_keeps_what_the_sdk_publishes_and_refuses_a_wrong_key(tmp_path, sink_env, monkeypatch):
    sink = sink_env(EventSink(file=tmp_path / "events.jsonl").start())
    try:
        events.publish(sink.endpoint, event(), credential=None)
        events.publish(sink.endpoint, event(), credential=None)  # a repeat keeps its id
        monkeypatch.setenv(SETTING_EVENTS_KEY, "wrong")
        with pytest.raises(ClientAuthenticationError):
            events.publish(sink.endpoint, event("failed"), credential=None)
    finally:
        sink.stop()
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["id"] for e in lines] == [event()["id"]] * 2 and lines[0]["data"] == event()["data"]


class FlakyReceiver(BaseHTTPRequestHandler):
    """A subscriber's webhook that answers 503 to its first ``failures`` requests."""

    failures = 0
    received: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if FlakyReceiver.failures > 0:
            FlakyReceiver.failures -= 1
            self.send_error(503)
            return
        assert self.headers["Content-Type"].startswith("application/cloudevents+json")
        FlakyReceiver.received.append(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_an_event_the_subscriber_could_not_take_is_published_again_until_it_does(sink_env):
    FlakyReceiver.failures, FlakyReceiver.received = FORWARD_TRIES, []  # the whole first publish fails
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sink = sink_env(EventSink(url=f"http://127.0.0.1:{server.server_address[1]}/hook").start())
    try:
        events.publish(sink.endpoint, event(), credential=None)  # answered 500 first, retried by the SDK
    finally:
        sink.stop()
        server.shutdown()
    assert [e["id"] for e in FlakyReceiver.received] == [event()["id"]]


@pytest.mark.slow
def test_a_job_announces_its_end_once_however_often_its_upload_is_delivered(storage, app_env, tmp_path):
    """Three deliveries of the upload and every activity run twice: one completed event in
    effect (each publish of it has the same id); a corrupt upload: one failed event."""
    env = {**os.environ, **app_env.env}
    log = tmp_path / "events.jsonl"
    scene = make_scene(tmp_path / "evented.tif", 300, 260)
    args = ("--hub", app_env.hub, "--events-file", str(log))
    done = run_cli(env, "process", str(scene), *args, "--deliveries", "3", "--duplicate-activities")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    corrupt = tmp_path / "corrupt.tif"
    corrupt.write_bytes(b"II*\x00" + b"\x00" * 100)
    failed = run_cli(env, "process", str(corrupt), *args)
    assert failed.returncode == 1, failed.stderr

    published = [json.loads(line) for line in log.read_text().splitlines()]
    for raw in published:
        check_cloud_event(raw)
    by_subject = {}
    for raw in published:
        by_subject.setdefault(raw["subject"], []).append(raw)
    assert sorted(by_subject) == ["corrupt.tif", "evented.tif"]
    completed_copies = by_subject["evented.tif"]
    assert 1 <= len(completed_copies) <= 2  # the activity ran twice: the same event, twice at most
    assert len({json.dumps(e, sort_keys=True) for e in completed_copies}) == 1
    (completed,) = completed_copies[:1]
    assert completed["type"] == events.COMPLETED
    data = completed["data"]
    assert data["job_id"] == summary["job_id"] and data["windows"] == summary["windows"] == 4
    output = storage.blob_service().get_container_client(app_env.output)
    urls = {"mosaic": summary["mosaic_url"], "stac": summary["stac_url"], "quicklook": summary["quicklook_url"]}
    for name, url in urls.items():
        stored = output.get_blob_client(url.split(f"/{app_env.output}/", 1)[1]).get_blob_properties()
        assert data["outputs"][name] == {"url": url, "etag": stored.etag.strip('"')}
    upload = storage.blob_service().get_blob_client(app_env.input, "evented.tif").get_blob_properties()
    assert data["upload"]["etag"] == upload.etag.strip('"') and data["error"] is None
    (bad,) = by_subject["corrupt.tif"]
    assert bad["type"] == events.FAILED
    assert bad["data"]["error"]["type"] == "BadInputFailure" and "corrupt.tif" in bad["data"]["error"]["message"]
    assert bad["data"]["outputs"] == {} and bad["id"] != completed["id"]


@pytest.mark.slow
def test_a_publish_that_outlasts_its_own_retries_is_retried_by_the_job_and_lands_once(storage, app_env, tmp_path):
    """The subscriber refuses long enough for the publishing activity's first attempt to fail (the
    SDK's own retries included): the job's retry policy runs it again, and the subscriber gets the
    event once, with the id it would have had."""
    refusals = FORWARD_TRIES * 4  # every forward of the first attempt's four requests (the SDK's 3 retries)
    FlakyReceiver.failures, FlakyReceiver.received = refusals, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FlakyReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    scene = make_scene(tmp_path / "refused.tif", 300, 260)
    env = {**os.environ, **app_env.env}
    try:
        done = run_cli(env, "process", str(scene), "--hub", app_env.hub, "--events-url", url, "--timer-scale", "0.01")
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert FlakyReceiver.failures == 0  # all refusals were used up: the first attempt did fail
    assert [(e["type"], e["data"]["job_id"]) for e in FlakyReceiver.received] == [(events.COMPLETED, summary["job_id"])]
    assert "publish_job_event" in done.stderr  # the failed attempt is logged by the host
