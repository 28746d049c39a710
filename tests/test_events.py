"""Completion events: their ids and shape, the local topic that keeps them, and a job's events
end to end on the local host (``--events-file``)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from azure.core.exceptions import ClientAuthenticationError
from azure.core.messaging import CloudEvent

from devhost.event_sink import FORWARD_TRIES, EventSink
from tilecommit import events
from tilecommit.settings import SETTING_EVENTS_KEY

from .app_jobs import make_scene
from .test_cli import run_cli

JOB = {
    "job_id": "0123456789abcdef",
    "blob": "a/scene.tif",
    "url": "http://127.0.0.1:1/dev/raster-uploads/a/scene.tif",
    "etag": "0x1",
}


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
    parsed = CloudEvent.from_dict(raw)
    assert (parsed.type, parsed.subject, parsed.source) == (
        events.COMPLETED,
        "a/scene.tif",
        "http://127.0.0.1:1/dev/raster-uploads",
    )
    assert raw["specversion"] == "1.0" and raw["datacontenttype"] == "application/json"
    assert raw["data"]["upload"] == {"blob": "a/scene.tif", "url": JOB["url"], "etag": "0x1"}


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
    env = {**os.environ, **app_env.env}
    log = tmp_path / "events.jsonl"
    scene = make_scene(tmp_path / "evented.tif", 300, 260)
    done = run_cli(env, "process", str(scene), "--hub", app_env.hub, "--deliveries", "2", "--events-file", str(log))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    corrupt = tmp_path / "corrupt.tif"
    corrupt.write_bytes(b"II*\x00" + b"\x00" * 100)
    failed = run_cli(env, "process", str(corrupt), "--hub", app_env.hub, "--events-file", str(log))
    assert failed.returncode == 1, failed.stderr

    completed, bad = [json.loads(line) for line in log.read_text().splitlines()]
    assert completed["type"] == events.COMPLETED and completed["subject"] == "evented.tif"
    data = completed["data"]
    assert data["job_id"] == summary["job_id"] and data["windows"] == summary["windows"] == 4
    output = storage.blob_service().get_container_client(app_env.output)
    for name, url in (
        ("mosaic", summary["mosaic_url"]),
        ("stac", summary["stac_url"]),
        ("quicklook", summary["quicklook_url"]),
    ):
        stored = output.get_blob_client(url.split(f"/{app_env.output}/", 1)[1]).get_blob_properties()
        assert data["outputs"][name] == {"url": url, "etag": stored.etag.strip('"')}
    upload = storage.blob_service().get_blob_client(app_env.input, "evented.tif").get_blob_properties()
    assert data["upload"]["etag"] == upload.etag.strip('"') and data["error"] is None
    assert bad["type"] == events.FAILED and bad["subject"] == "corrupt.tif"
    assert bad["data"]["error"]["type"] == "BadInputFailure" and "corrupt.tif" in bad["data"]["error"]["message"]
    assert bad["data"]["outputs"] == {} and bad["id"] != completed["id"]
