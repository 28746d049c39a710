"""The storage gates against a real Azurite: create-only blob, If-Match repair,
create-only manifest rows, the classification of 409/412, and unknown outcomes.

No storage is mocked. Faults that cannot be caused for real (a response lost on the way back,
a connection that fails before the request leaves) are injected by a pipeline policy placed
inside the SDK's retry loop, and each such test says so in its docstring.

How policies are attached (measured with azure-storage-blob 12.31.1): the blob SDK silently
ignores ``per_retry_policies`` / ``per_call_policies`` (a policy passed that way never sees a
request); its own hook is ``_additional_pipeline_policies``, appended after the retry, signing
and logging policies, just before the transport: every attempt passes through it, already
signed. A change of a *signed* header (the conditional headers are) therefore has to happen
before signing, in ``raw_request_hook``. Every test that uses a policy also asserts that the
policy saw the requests, so a policy the SDK dropped would fail the test instead of passing it.
The Tables SDK honours ``per_retry_policies`` (after its retry policy, after signing).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.policies import HTTPPolicy
from azure.data.tables import EdmType, EntityProperty, TableClient
from azure.storage.blob import ContainerClient, ExponentialRetry

from tilecommit import conditional, gates
from tilecommit.errors import BadInputError, BodyTooLargeError, ConfigurationError, StorageFaultError
from tilecommit.gates import Outcome
from tilecommit.grid import Window
from tilecommit.jobs import tile_blob_name
from tilecommit.manifest import ManifestEntry, count_manifest, get_manifest_entry, record_manifest_entry

from .conftest import counter_total

JOB = "0123456789abcdef"
MiB = 1024 * 1024

PRECONDITION = "ConditionalWritePreconditionFailed"
MISMATCH = "ConditionalWriteContentMismatch"
RESOLVED = "ConditionalWriteUnknownOutcomeResolved"


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def tile(window: Window, salt: bytes = b"") -> bytes:
    """Some bytes standing in for an encoded tile (content does not matter to the gate)."""
    return (b"II*\x00" + window.id.encode() + salt) * 64


class Counters:
    """Reads the gate counters now; ``delta`` gives the growth since then (counters are cumulative)."""

    def __init__(self, gate: str):
        self.gate = gate
        self.start = self._read()

    def _read(self) -> dict[str, int]:
        return {
            "rejected": counter_total(PRECONDITION, gate=self.gate),
            "rejected_409": counter_total(PRECONDITION, gate=self.gate, status="409"),
            "rejected_412": counter_total(PRECONDITION, gate=self.gate, status="412"),
            "rejected_none": counter_total(PRECONDITION, gate=self.gate, status="None"),
            "mismatch": counter_total(MISMATCH, gate=self.gate),
            "resolved": counter_total(RESOLVED, gate=self.gate),
        }

    def delta(self) -> dict[str, int]:
        now = self._read()
        return {k: now[k] - self.start[k] for k in now}


# ----------------------------------------------------------------------------- policies (test doubles)


@dataclass
class Seen:
    method: str
    url: str
    headers: dict[str, str]
    sent: bool

    @property
    def query(self) -> str:
        return self.url.partition("?")[2]


class Recorder(HTTPPolicy):
    """Records every attempt that reaches the transport (method, URL, headers); changes nothing."""

    def __init__(self):
        super().__init__()
        self.seen: list[Seen] = []

    def record(self, request, sent: bool = True) -> Seen:
        http = request.http_request
        item = Seen(http.method, http.url, {k.lower(): v for k, v in http.headers.items()}, sent)
        self.seen.append(item)
        return item

    def send(self, request):
        self.record(request)
        return self.next.send(request)

    def puts(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "PUT"]

    def clear(self) -> None:
        self.seen.clear()


class LoseResponses(Recorder):
    """Test double: lets the first ``times`` requests of ``method`` reach Azurite, then raises
    ServiceResponseError instead of returning the answer (the response was lost on the way back).
    ``before`` runs just before such a request is sent (e.g. another writer getting there first)."""

    def __init__(self, method: str = "PUT", times: int = 1, before=None):
        super().__init__()
        self.method, self.left, self.before = method, times, before
        self.lost: list[int] = []

    def send(self, request):
        self.record(request)
        if request.http_request.method == self.method and self.left > 0:
            self.left -= 1
            if self.before:
                self.before()
            response = self.next.send(request)
            self.lost.append(response.http_response.status_code)
            raise ServiceResponseError("test double: connection reset while reading the response")
        return self.next.send(request)


class FailBeforeSending(Recorder):
    """Test double: the first ``times`` requests of ``method`` fail to connect (ServiceRequestError)
    and are never sent; later ones go through."""

    def __init__(self, method: str = "PUT", times: int = 1):
        super().__init__()
        self.method, self.left = method, times

    def send(self, request):
        if request.http_request.method == self.method and self.left > 0:
            self.left -= 1
            self.record(request, sent=False)
            raise ServiceRequestError("test double: connection refused before the request was sent")
        return super().send(request)


def container_client(storage, container: ContainerClient, *policies, **kwargs) -> ContainerClient:
    """A second client on the same container whose every attempt passes through ``policies``."""
    return ContainerClient.from_connection_string(
        storage.connection_string,
        container.container_name,
        _additional_pipeline_policies=list(policies),
        **kwargs,
    )


#: The SDK's own retries, without the default 15-second back-off (keeps the tests quick).
FAST_SDK_RETRY = {"retry_policy": ExponentialRetry(initial_backoff=0, increment_base=0, random_jitter_range=0)}
#: The SDK's retries off: a transport fault reaches commit_blob at once.
NO_SDK_RETRY = {"retry_total": 0}


def snapshot(container: ContainerClient, name: str) -> dict:
    blob = container.get_blob_client(name)
    props = blob.get_blob_properties()
    return {
        "etag": props.etag,
        "last_modified": props.last_modified,
        "size": props.size,
        "content_md5": bytes(props.content_settings.content_md5 or b""),
        "metadata": dict(props.metadata),
        "content": blob.download_blob().readall(),
    }


# ----------------------------------------------------------------------------- commit_blob basics


def test_commit_writes_body_and_its_sha256_in_one_put(storage, container):
    recorder = Recorder()
    client = container_client(storage, container, recorder)
    window = Window(2, 7, 2048, 7168, 1024, 1024)
    name, body = tile_blob_name(JOB, window), tile(window)

    assert gates.commit_blob(client, name, body, metadata={"job": JOB}, job_id=JOB) is Outcome.WRITTEN

    # One request, and it is the conditional put: nothing read first, nothing staged.
    assert [(s.method, s.headers.get("if-none-match")) for s in recorder.seen] == [("PUT", "*")]
    put = recorder.seen[0]
    assert put.headers["x-ms-blob-type"] == "BlockBlob"
    assert put.headers["x-ms-meta-sha256"] == sha(body)
    assert "if-match" not in put.headers
    state = snapshot(container, name)
    assert state["content"] == body
    # The write id (one request's own) rides in the same put: what tells this write from another's.
    write_id = put.headers["x-ms-meta-write_id"]
    assert state["metadata"] == {"job": JOB, gates.SHA256_METADATA_KEY: sha(body), conditional.WRITE_ID_KEY: write_id}
    assert container.get_blob_client(name).get_blob_properties().content_settings.content_type == "image/tiff"
    assert gates.stored_blob_sha256(container.get_blob_client(name))[0] == sha(body)
    assert gates.stored_blob_sha256(container.get_blob_client("absent.tif")) == (None, None)
    assert str(Outcome.WRITTEN) == "written"


def test_second_commit_leaves_etag_last_modified_size_and_content_unchanged(container):
    name = "tiles/x/0000_0000.tif"
    first = b"first-body" * 100
    assert gates.commit_blob(container, name, first) is Outcome.WRITTEN
    before = snapshot(container, name)
    time.sleep(1.1)  # Last-Modified has a one-second resolution: an overwrite now would show.

    counters = Counters("blob")
    other = b"a longer, different body" * 100
    assert gates.commit_blob(container, name, other, metadata={"extra": "1"}) is Outcome.ALREADY_PRESENT
    assert gates.commit_blob(container, name, first) is Outcome.ALREADY_PRESENT

    assert snapshot(container, name) == before
    assert before["size"] == len(first) and before["content"] == first
    assert counters.delta()["rejected"] == 2


def test_other_bytes_under_a_taken_key_warn_and_count_a_mismatch(container, caplog):
    caplog.set_level(logging.INFO, logger="tilecommit.conditional")
    name = "tiles/y/0001_0001.tif"
    ours, theirs = b"ours" * 300, b"theirs" * 300
    assert gates.commit_blob(container, name, ours, job_id="aaaaaaaaaaaaaaaa") is Outcome.WRITTEN
    caplog.clear()

    counters = Counters("blob")
    assert gates.commit_blob(container, name, theirs, job_id="bbbbbbbbbbbbbbbb") is Outcome.ALREADY_PRESENT
    assert counters.delta() == {
        "rejected": 1,
        "rejected_409": 1,
        "rejected_412": 0,
        "rejected_none": 0,
        "mismatch": 1,
        "resolved": 0,
    }
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "bbbbbbbbbbbbbbbb" in text and name in text and sha(theirs) in text and sha(ours) in text
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "job_id=bbbbbbbbbbbbbbbb" in infos[0].getMessage()

    # The same bytes again: a rejection (logged at INFO with its job id), no warning, no mismatch.
    caplog.clear()
    counters = Counters("blob")
    assert gates.commit_blob(container, name, ours, job_id="cccccccccccccccc") is Outcome.ALREADY_PRESENT
    assert counters.delta()["rejected"] == 1 and counters.delta()["mismatch"] == 0
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "job_id=cccccccccccccccc" in caplog.records[0].getMessage()
    assert snapshot(container, name)["content"] == ours


# ----------------------------------------------------------------------------- contention


def test_32_writers_20_rounds_exactly_one_winner_each(storage, container, record_property, capsys, caplog):
    caplog.set_level(logging.INFO, logger="tilecommit.conditional")
    writers, rounds = 32, 20
    clients = [
        ContainerClient.from_connection_string(storage.connection_string, container.container_name)
        for _ in range(writers)
    ]
    barrier = threading.Barrier(writers, timeout=60)
    counters = Counters("blob")

    def write(i: int, name: str, body: bytes) -> Outcome:
        barrier.wait()  # all 32 leave together
        return gates.commit_blob(clients[i], name, body, job_id=JOB)

    round_times, winners = [], []
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=writers) as pool:
        for r in range(rounds):
            name = f"race/{r:02d}.tif"
            bodies = [f"writer {i:02d} round {r:02d};".encode() * 40 for i in range(writers)]
            t0 = time.perf_counter()
            futures = [pool.submit(write, i, name, bodies[i]) for i in range(writers)]
            outcomes = [f.result(timeout=120) for f in futures]  # re-raises any exception
            round_times.append(time.perf_counter() - t0)

            written = [i for i, o in enumerate(outcomes) if o is Outcome.WRITTEN]
            assert len(written) == 1, f"round {r}: {len(written)} winners"
            assert outcomes.count(Outcome.ALREADY_PRESENT) == writers - 1
            # What is stored is exactly the winner's body and the winner's sha256.
            state = snapshot(container, name)
            assert state["content"] == bodies[written[0]]
            assert state["metadata"][gates.SHA256_METADATA_KEY] == sha(bodies[written[0]])
            winners.append(written[0])
    elapsed = time.perf_counter() - started

    delta = counters.delta()
    rejections = (writers - 1) * rounds
    assert delta["rejected"] == rejections
    assert delta["mismatch"] == rejections  # every writer had its own bytes
    assert delta["resolved"] == 0
    refused_logs = [
        r for r in caplog.records if r.levelno == logging.INFO and "conditional write refused" in r.getMessage()
    ]
    assert len(refused_logs) == rejections
    assert all(f"job_id={JOB}" in r.getMessage() for r in refused_logs)

    figures = {
        "rounds": rounds,
        "writers": writers,
        "winners": len(winners),
        "rejections_expected": rejections,
        "precondition_failed_counted": delta["rejected"],
        "of_which_409": delta["rejected_409"],
        "of_which_412": delta["rejected_412"],
        "content_mismatch_counted": delta["mismatch"],
        "wall_s": round(elapsed, 3),
        "round_s_min": round(min(round_times), 3),
        "round_s_max": round(max(round_times), 3),
        "distinct_winning_writers": len(set(winners)),
    }
    for key, value in figures.items():
        record_property(key, value)
    with capsys.disabled():  # shown with or without -s
        print("\ncontention figures: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


# ----------------------------------------------------------------------------- request shape


def test_a_body_above_the_default_single_put_size_goes_as_one_conditional_put(storage, container):
    """With SINGLE_PUT_CLIENT_OPTIONS a body above the SDK's default 64 MiB threshold is one Put Blob."""
    recorder = Recorder()
    client = container_client(storage, container, recorder, **gates.SINGLE_PUT_CLIENT_OPTIONS)
    body = bytes(range(256)) * (65 * MiB // 256)

    assert gates.commit_blob(client, "big/one.tif", body) is Outcome.WRITTEN
    assert len(recorder.seen) == 1
    put = recorder.seen[0]
    assert put.method == "PUT" and put.headers["if-none-match"] == "*"
    assert int(put.headers["content-length"]) == 65 * MiB
    assert "comp=block" not in put.query and "blockid" not in put.query
    assert snapshot(container, "big/one.tif")["content"] == body

    # The duplicate is refused on its single request (then one read of the stored sha256).
    recorder.clear()
    assert gates.commit_blob(client, "big/one.tif", body) is Outcome.ALREADY_PRESENT
    assert [s.method for s in recorder.seen] == ["PUT", "HEAD"]
    assert "comp=block" not in recorder.seen[0].query and recorder.seen[0].headers["if-none-match"] == "*"


def test_a_client_that_would_stage_blocks_is_refused_before_any_request(storage, container):
    recorder = Recorder()
    client = container_client(storage, container, recorder, max_single_put_size=1 * MiB, max_block_size=1 * MiB)
    body = bytes(range(256)) * (3 * MiB // 256)

    for call in (
        lambda: gates.commit_blob(client, "big/one.tif", body),
        lambda: gates.repair_blob(client, "big/one.tif", body, expect_etag='"0x1"'),
    ):
        with pytest.raises(ConfigurationError, match="SINGLE_PUT_CLIENT_OPTIONS"):
            call()
    assert recorder.seen == []

    # Why: the same client, without the gate, stages blocks that carry no condition.
    client.upload_blob("big/staged.tif", body, overwrite=False)
    comps = [parse_qs(s.query).get("comp", [""])[0] for s in recorder.puts()]
    assert comps == ["block", "block", "block", "blocklist"]
    assert [s.headers.get("if-none-match") for s in recorder.puts()] == [None, None, None, "*"]


def test_a_body_larger_than_one_put_blob_is_refused_before_any_request(storage, container, monkeypatch):
    """MAX_PUT_BLOB_BYTES is lowered to 1,024 bytes: a real 5,000 MiB body cannot be allocated
    in a test on this machine, and the check only compares the length with the constant."""
    monkeypatch.setattr(gates, "MAX_PUT_BLOB_BYTES", 1024)
    recorder = Recorder()
    client = container_client(storage, container, recorder)

    for call in (
        lambda: gates.commit_blob(client, "too/big.tif", b"x" * 1025),
        lambda: gates.repair_blob(client, "too/big.tif", b"x" * 1025, expect_etag='"0x1"'),
    ):
        with pytest.raises(BodyTooLargeError) as info:
            call()
        assert isinstance(info.value, BadInputError) and not info.value.retryable
        assert "too/big.tif" in str(info.value)
    assert recorder.seen == []
    assert not container.get_blob_client("too/big.tif").exists()

    # At the limit exactly, it is written.
    assert gates.commit_blob(client, "too/big.tif", b"x" * 1024) is Outcome.WRITTEN
    assert [s.method for s in recorder.seen] == ["PUT"]


# ----------------------------------------------------------------------------- 409 / 412 classification


def test_a_412_condition_not_met_is_already_present_too(storage, container):
    """Test double: ``raw_request_hook`` (before signing) turns the put's ``If-None-Match: *``
    into ``If-Match: <stale etag>``, so Azurite itself answers 412 ConditionNotMet, the status
    some service paths use for a taken key."""
    name = "tiles/z/0000_0003.tif"
    old = container.get_blob_client(name).upload_blob(b"v1")["etag"]
    container.get_blob_client(name).upload_blob(b"v2", overwrite=True)  # `old` is now stale
    before = snapshot(container, name)

    rewritten = []

    def to_stale_if_match(request):
        headers = request.http_request.headers
        if request.http_request.method == "PUT" and headers.get("If-None-Match") == "*":
            del headers["If-None-Match"]
            headers["If-Match"] = old
            rewritten.append(request.http_request.url)

    recorder = Recorder()
    client = container_client(storage, container, recorder, raw_request_hook=to_stale_if_match)
    counters = Counters("blob")
    assert gates.commit_blob(client, name, b"v3", job_id=JOB) is Outcome.ALREADY_PRESENT
    assert len(rewritten) == 1 and recorder.puts()[0].headers["if-match"] == old
    assert counters.delta()["rejected_412"] == 1 and counters.delta()["rejected"] == 1
    assert snapshot(container, name) == before


def _capture(call) -> HttpResponseError:
    with pytest.raises(HttpResponseError) as info:
        call()
    return info.value


def test_is_create_rejection_on_real_exceptions_from_azurite(storage, container, table):
    blob = container.get_blob_client("classify.tif")
    etag = blob.upload_blob(b"1")["etag"]

    taken = _capture(lambda: blob.upload_blob(b"2", overwrite=False))
    # The SDK trap (docs/design.md, 'Storage semantics'): overwrite=False plus a failing If-Match is raised as
    # ResourceExistsError although the service said 412 ConditionNotMet.
    trap = _capture(
        lambda: blob.upload_blob(
            b"2", overwrite=False, etag='"0x8D000000000000"', match_condition=MatchConditions.IfNotModified
        )
    )
    stale = _capture(
        lambda: blob.upload_blob(
            b"2", overwrite=True, etag='"0x8D000000000000"', match_condition=MatchConditions.IfNotModified
        )
    )
    table.create_entity({"PartitionKey": JOB, "RowKey": "r"})
    entity_taken = _capture(lambda: table.create_entity({"PartitionKey": JOB, "RowKey": "r"}))

    lease = blob.acquire_lease(-1)
    lease_taken = _capture(lambda: blob.acquire_lease(-1))
    lease.release()
    container_taken = _capture(lambda: container.create_container())
    not_found = _capture(lambda: container.get_blob_client("nope").get_blob_properties())
    archived = container.get_blob_client("archived.tif")
    archived.upload_blob(b"cold")
    archived.set_standard_blob_tier("Archive")
    blob_archived = _capture(lambda: archived.upload_blob(b"new", overwrite=True))

    facts = {
        "taken": (taken, ResourceExistsError, 409, "BlobAlreadyExists", True),
        "trap": (trap, ResourceExistsError, 412, "BlobAlreadyExists", True),
        "stale": (stale, ResourceModifiedError, 412, "ConditionNotMet", True),
        "entity_taken": (entity_taken, ResourceExistsError, 409, "EntityAlreadyExists", True),
        "lease_taken": (lease_taken, ResourceExistsError, 409, "LeaseAlreadyPresent", False),
        "container_taken": (container_taken, ResourceExistsError, 409, "ContainerAlreadyExists", False),
        "not_found": (not_found, ResourceNotFoundError, 404, "BlobNotFound", False),
        "blob_archived": (blob_archived, ResourceExistsError, 409, "BlobArchived", False),
    }
    for label, (exc, cls, status, code, rejection) in facts.items():
        assert isinstance(exc, cls), label
        assert exc.status_code == status, label
        # Private: the gates' own reading of an SDK error's code, pinned here against what each service said.
        assert gates.error_code(exc) == code, label
        assert gates.is_create_rejection(exc) is rejection, label
    # The trap's header still says what the service said; the Tables 409 has no error_code at all.
    assert trap.response.headers["x-ms-error-code"] == "ConditionNotMet"
    assert getattr(entity_taken, "error_code", None) is None
    assert entity_taken.response.headers["x-ms-error-code"] == "EntityAlreadyExists"
    assert blob.get_blob_properties().etag == etag


def test_a_conflict_of_another_code_is_a_storage_fault_not_a_rejection(storage, container):
    """Test double: ``raw_request_hook`` drops ``If-None-Match`` from the put (before signing),
    so that Azurite itself answers a 409 that is not BlobAlreadyExists: BlobArchived. (With the
    condition in place Azurite checks it first and answers BlobAlreadyExists.)"""
    name = "cold/0000_0000.tif"
    blob = container.get_blob_client(name)
    blob.upload_blob(b"cold bytes")
    blob.set_standard_blob_tier("Archive")
    etag = blob.get_blob_properties().etag

    def drop_condition(request):
        if request.http_request.method == "PUT":
            request.http_request.headers.pop("If-None-Match", None)

    recorder = Recorder()
    client = container_client(storage, container, recorder, raw_request_hook=drop_condition)
    counters = Counters("blob")
    with pytest.raises(StorageFaultError) as info:
        gates.commit_blob(client, name, b"new bytes", job_id=JOB)
    assert "409" in str(info.value) and "BlobArchived" in str(info.value)
    assert info.value.retryable is False
    assert isinstance(info.value.__cause__, ResourceExistsError)
    assert [s.method for s in recorder.seen] == ["PUT"] and "if-none-match" not in recorder.seen[0].headers
    assert counters.delta()["rejected"] == 0 and counters.delta()["mismatch"] == 0
    assert blob.get_blob_properties().etag == etag


def test_a_missing_container_is_a_storage_fault(storage):
    missing = storage.blob_service().get_container_client("no-such-container")
    with pytest.raises(StorageFaultError) as info:
        gates.commit_blob(missing, "a.tif", b"x")
    assert "404" in str(info.value) and info.value.retryable is False


def test_a_pinned_read_of_a_version_replaced_or_deleted_meanwhile_is_read_again(container, azurite):
    """A read of the app's own blob pinned to the version it inspected (If-Match) that finds that
    version replaced (412) or deleted is a fault to retry: the retry reads whatever storage holds
    then. Azure answers a pinned read of a deleted blob 404 BlobNotFound, where Azurite answers 412
    ConditionNotMet: the 404 is Azure's, answered by the fault proxy. Read unpinned, a blob that is
    not there is the plain 404 it is."""
    from testkit.storage_proxy import FaultPlan, FaultProxy

    from .test_read_faults import quick_client

    blob = container.get_blob_client("read/0000_0000.tif")
    blob.upload_blob(b"first version")
    etag = blob.get_blob_properties().etag
    blob.upload_blob(b"second version", overwrite=True)
    with pytest.raises(StorageFaultError) as replaced:
        gates.content_sha256(blob, etag)
    blob.delete_blob()
    deleted_on_azure = FaultPlan(busy=1.0, status=404, code="BlobNotFound", retry_after=None)
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", deleted_on_azure) as proxy:
        through = quick_client(azurite, proxy).get_blob_client(container.container_name, blob.blob_name)
        with pytest.raises(StorageFaultError) as deleted:
            gates.content_bytes(through, etag)
    with pytest.raises(StorageFaultError) as absent:
        gates.content_bytes(blob)
    assert (replaced.value.status, replaced.value.retryable) == (412, True), replaced.value
    assert (deleted.value.status, deleted.value.retryable) == (404, True), deleted.value
    assert proxy.injected["busy"] == 1
    assert (absent.value.status, absent.value.retryable) == (404, False), absent.value


# ----------------------------------------------------------------------------- lost responses


def test_lost_response_sdk_retry_gets_409_and_the_write_id_says_written(storage, container):
    """Test double: the first PUT reaches Azurite (201) and the policy then raises
    ServiceResponseError instead of returning it; the SDK's own retry resends the put."""
    name = "lost/0000_0000.tif"
    body = b"rendered once" * 50
    lose = LoseResponses("PUT", times=1)
    client = container_client(storage, container, lose, **FAST_SDK_RETRY)
    counters = Counters("blob")

    outcome = gates.commit_blob(client, name, body, job_id=JOB)

    # The SDK's retry of our own landed put is refused (409), and the gate never saw the lost
    # answer; the write id stored with the blob is the put's own, so it was this write.
    assert outcome is Outcome.WRITTEN
    assert lose.lost == [201]
    assert [s.method for s in lose.seen] == ["PUT", "PUT", "HEAD"]
    assert all(s.headers["if-none-match"] == "*" for s in lose.puts())
    assert len({s.headers["x-ms-meta-write_id"] for s in lose.puts()}) == 1
    assert snapshot(container, name)["content"] == body
    assert counters.delta()["mismatch"] == 0
    assert counters.delta()["rejected"] == 0
    assert counters.delta()["resolved"] == 1


def test_lost_201_without_sdk_retries_is_resolved_as_written_from_the_sha256(storage, container):
    """Test double: the PUT reaches Azurite (201) and its response is replaced by ServiceResponseError;
    the SDK's retries are off, so commit_blob itself sees the unknown outcome."""
    name = "lost/0000_0001.tif"
    body = b"mine" * 100
    lose = LoseResponses("PUT", times=1)
    client = container_client(storage, container, lose, **NO_SDK_RETRY)
    counters = Counters("blob")

    assert gates.commit_blob(client, name, body, job_id=JOB) is Outcome.WRITTEN
    assert lose.lost == [201]
    assert [s.method for s in lose.seen] == ["PUT", "HEAD"]  # resolved by reading, not by re-putting
    assert counters.delta()["resolved"] == 1
    assert counters.delta()["rejected"] == 0 and counters.delta()["mismatch"] == 0
    assert snapshot(container, name)["content"] == body


def test_connection_failure_before_sending_retries_the_same_conditional_put(storage, container):
    """Test double: the first PUT fails with ServiceRequestError before anything is sent; the
    SDK's retries are off, so commit_blob finds nothing stored and puts again, conditionally."""
    name = "lost/0000_0002.tif"
    body = b"retry me" * 100
    fail = FailBeforeSending("PUT", times=1)
    client = container_client(storage, container, fail, **NO_SDK_RETRY)

    assert gates.commit_blob(client, name, body, job_id=JOB) is Outcome.WRITTEN
    assert [(s.method, s.sent) for s in fail.seen] == [("PUT", False), ("HEAD", True), ("PUT", True)]
    assert all(s.headers.get("if-none-match") == "*" and "if-match" not in s.headers for s in fail.puts())
    assert snapshot(container, name)["content"] == body


def test_no_answer_at_all_is_a_retryable_fault_and_every_put_stayed_conditional(storage, container):
    """Test double: every PUT fails before it is sent (ServiceRequestError); SDK retries off."""
    fail = FailBeforeSending("PUT", times=100)
    client = container_client(storage, container, fail, **NO_SDK_RETRY)
    with pytest.raises(StorageFaultError) as info:
        gates.commit_blob(client, "lost/never.tif", b"x", job_id=JOB)
    assert info.value.retryable is True
    puts = fail.puts()
    assert len(puts) == conditional.UNKNOWN_OUTCOME_ATTEMPTS
    assert all(s.headers.get("if-none-match") == "*" for s in puts)
    assert not container.get_blob_client("lost/never.tif").exists()


def test_another_writers_bytes_after_a_lost_response_are_already_present_with_a_mismatch(storage, container):
    """Test double: just before our PUT leaves, another writer commits other bytes under the key
    (for real, through its own client); our PUT then gets Azurite's 409, and the policy loses
    that answer (ServiceResponseError). SDK retries off."""
    name = "lost/0000_0003.tif"
    ours, theirs = b"ours" * 100, b"theirs" * 100
    other_writer = ContainerClient.from_connection_string(storage.connection_string, container.container_name)
    lose = LoseResponses("PUT", times=1, before=lambda: gates.commit_blob(other_writer, name, theirs))
    client = container_client(storage, container, lose, **NO_SDK_RETRY)
    counters = Counters("blob")

    assert gates.commit_blob(client, name, ours, job_id=JOB) is Outcome.ALREADY_PRESENT
    assert lose.lost == [409]
    delta = counters.delta()
    assert delta["resolved"] == 1 and delta["mismatch"] == 1 and delta["rejected_none"] == 1
    state = snapshot(container, name)
    assert state["content"] == theirs and state["metadata"][gates.SHA256_METADATA_KEY] == sha(theirs)


# ----------------------------------------------------------------------------- repair_blob


def test_repair_with_a_stale_etag_is_superseded_and_leaves_the_newer_blob(storage, container):
    name = "repair/stale.tif"
    blob = container.get_blob_client(name)
    stale = blob.upload_blob(b"v1")["etag"]
    blob.upload_blob(b"v2 newer", overwrite=True)
    before = snapshot(container, name)
    counters = Counters("blob-repair")

    assert gates.repair_blob(container, name, b"v3 repair", expect_etag=stale, job_id=JOB) is Outcome.SUPERSEDED
    assert snapshot(container, name) == before and before["content"] == b"v2 newer"
    assert counters.delta()["rejected_412"] == 1


def test_repair_with_the_current_etag_replaces_it_and_writes_the_new_sha256(storage, container):
    name = "repair/current.tif"
    assert gates.commit_blob(container, name, b"bad tile") is Outcome.WRITTEN
    current = container.get_blob_client(name).get_blob_properties().etag
    recorder = Recorder()
    client = container_client(storage, container, recorder)

    fixed = b"good tile" * 10
    assert gates.repair_blob(client, name, fixed, expect_etag=current, metadata={"repaired": "yes"}) is Outcome.WRITTEN
    assert [(s.method, s.headers.get("if-match")) for s in recorder.seen] == [("PUT", current)]
    assert "if-none-match" not in recorder.seen[0].headers
    state = snapshot(container, name)
    assert state["content"] == fixed and state["etag"] != current
    write_id = recorder.seen[0].headers["x-ms-meta-write_id"]
    assert state["metadata"] == {
        "repaired": "yes",
        gates.SHA256_METADATA_KEY: sha(fixed),
        conditional.WRITE_ID_KEY: write_id,
    }


def test_repair_of_a_deleted_blob_is_superseded_and_does_not_recreate_it(container):
    name = "repair/deleted.tif"
    blob = container.get_blob_client(name)
    etag = blob.upload_blob(b"v1")["etag"]
    blob.delete_blob()
    assert gates.repair_blob(container, name, b"v2", expect_etag=etag) is Outcome.SUPERSEDED
    assert not blob.exists()


def test_repair_of_a_leased_blob_is_a_fault_not_superseded(container):
    """A lease (412 LeaseIdMissing) is not a newer version: the caller must not be told so."""
    name = "repair/leased.tif"
    blob = container.get_blob_client(name)
    etag = blob.upload_blob(b"v1")["etag"]
    lease = blob.acquire_lease(-1)
    try:
        with pytest.raises(StorageFaultError) as info:
            gates.repair_blob(container, name, b"v2", expect_etag=etag)
        assert "LeaseIdMissing" in str(info.value)
        assert blob.get_blob_properties().etag == etag
    finally:
        lease.release()
    assert blob.download_blob().readall() == b"v1"


def test_repair_into_a_missing_container_is_a_fault_not_superseded(storage):
    missing = storage.blob_service().get_container_client("no-such-container")
    with pytest.raises(StorageFaultError) as info:
        gates.repair_blob(missing, "a.tif", b"x", expect_etag='"0x8D000000000000"')
    assert "404" in str(info.value) and "ContainerNotFound" in str(info.value)


def test_repair_whose_201_is_lost_is_resolved_as_written(storage, container):
    """Test double: the repair PUT reaches Azurite (201) and its response is lost; SDK retries off."""
    name = "repair/lost.tif"
    etag = container.get_blob_client(name).upload_blob(b"v1")["etag"]
    lose = LoseResponses("PUT", times=1)
    client = container_client(storage, container, lose, **NO_SDK_RETRY)
    counters = Counters("blob-repair")
    assert gates.repair_blob(client, name, b"v2", expect_etag=etag) is Outcome.WRITTEN
    assert lose.lost == [201] and counters.delta()["resolved"] == 1
    assert snapshot(container, name)["content"] == b"v2"


# ----------------------------------------------------------------------------- manifest


def raw_row(table: TableClient, job: str, window: str) -> dict:
    entity = table.get_entity(job, window)
    return {**dict(entity), "_etag": entity.metadata["etag"], "_timestamp": entity.metadata["timestamp"]}


def test_manifest_entry_is_create_only_and_the_first_row_stays(table, caplog):
    caplog.set_level(logging.INFO, logger="tilecommit.conditional")
    window = Window(0, 3, 0, 3072, 1024, 1024)
    first = dict(uri="https://a/tiles/x/0000_0003.tif", nbytes=5_000_000_000, sha256=sha(b"first"))
    counters = Counters("manifest")

    assert record_manifest_entry(table, job_id=JOB, window=window, **first) is Outcome.WRITTEN
    row = raw_row(table, JOB, window.id)
    caplog.clear()
    assert (
        record_manifest_entry(
            table, job_id=JOB, window=window.id, uri="https://b/other.tif", nbytes=1, sha256=sha(b"second")
        )
        is Outcome.ALREADY_PRESENT
    )
    assert raw_row(table, JOB, window.id) == row
    assert get_manifest_entry(table, JOB, window) == ManifestEntry(
        window=window.id, uri=first["uri"], nbytes=first["nbytes"], sha256=first["sha256"]
    )
    delta = counters.delta()
    assert delta["rejected_409"] == 1 and delta["mismatch"] == 1
    assert any(r.levelno == logging.WARNING and JOB in r.getMessage() for r in caplog.records)
    assert any(r.levelno == logging.INFO and f"job_id={JOB}" in r.getMessage() for r in caplog.records)

    # The same row again (a retried activity): refused, and no mismatch this time.
    counters = Counters("manifest")
    assert record_manifest_entry(table, job_id=JOB, window=window, **first) is Outcome.ALREADY_PRESENT
    assert counters.delta()["rejected"] == 1 and counters.delta()["mismatch"] == 0


def test_get_manifest_entry_returns_the_row_or_none(table):
    window = Window(4, 5, 4096, 5120, 512, 1024)
    assert get_manifest_entry(table, JOB, window) is None
    record_manifest_entry(table, job_id=JOB, window=window, uri="u", nbytes=12, sha256="s" * 64)
    expected = ManifestEntry(window="0004_0005", uri="u", nbytes=12, sha256="s" * 64)
    assert get_manifest_entry(table, JOB, window) == expected
    assert get_manifest_entry(table, JOB, "0004_0005") == expected
    assert get_manifest_entry(table, "fedcba9876543210", window) is None
    assert get_manifest_entry(table, JOB, "0005_0004") is None


def test_count_manifest_reads_every_page_of_2500_rows(storage, table):
    windows = [Window(r, c, r * 256, c * 256, 256, 256) for r in range(50) for c in range(50)]
    rows = [
        {
            "PartitionKey": JOB,
            "RowKey": w.id,
            "uri": f"https://acct/raster-tiles/{tile_blob_name(JOB, w)}",
            "bytes": EntityProperty(3_000_000_000 + i, EdmType.INT64),  # beyond 32 bits
            "sha256": sha(w.id.encode()),
        }
        for i, w in enumerate(windows)
    ]
    for start in range(0, len(rows), 100):  # setup only: 25 transactions of 100 rows
        table.submit_transaction([("create", row) for row in rows[start : start + 100]])
    # Another job's rows in the same table must not be counted.
    for i in range(3):
        record_manifest_entry(table, job_id="fedcba9876543210", window=f"{i:04d}_0000", uri="x", nbytes=1, sha256="y")

    pages = Recorder()
    counted = TableClient.from_connection_string(
        storage.connection_string, table.table_name, per_retry_policies=[pages]
    )
    summary = count_manifest(counted, JOB)

    assert summary.job_id == JOB
    assert summary.rows == 2500
    assert summary.total_bytes == sum(3_000_000_000 + i for i in range(2500))
    assert summary.window_ids == sorted(w.id for w in windows)
    assert summary.entries["0049_0049"].uri.endswith("/0049_0049.tif")
    assert summary.entries["0012_0034"].sha256 == sha(b"0012_0034")
    assert [s.method for s in pages.seen] == ["GET", "GET", "GET"]  # 1,000 + 1,000 + 500
    assert count_manifest(table, "0000000000000000").rows == 0


def test_manifest_row_whose_answer_is_lost_is_resolved_from_its_sha256(storage, table):
    """Test double (Tables ``per_retry_policies``): the insert reaches Azurite and its answer is
    lost (ServiceResponseError); SDK retries off. Ours -> WRITTEN; another writer's -> ALREADY_PRESENT
    with the mismatch counted, as for blobs."""

    def insert_losing_its_answer(window: str, uri: str, nbytes: int, sha256: str, before=None):
        lose = LoseResponses("POST", times=1, before=before)
        client = TableClient.from_connection_string(
            storage.connection_string, table.table_name, per_retry_policies=[lose], retry_total=0
        )
        counters = Counters("manifest")
        outcome = record_manifest_entry(client, job_id=JOB, window=window, uri=uri, nbytes=nbytes, sha256=sha256)
        return outcome, lose.lost, counters.delta()

    outcome, lost, delta = insert_losing_its_answer("0000_0000", "u", 1, "a" * 64)
    assert outcome is Outcome.WRITTEN
    assert lost == [201]  # Insert Entity, created
    assert delta["resolved"] == 1

    def other_writer_first():
        record_manifest_entry(table, job_id=JOB, window="0000_0001", uri="theirs", nbytes=2, sha256="b" * 64)

    outcome, lost, delta = insert_losing_its_answer("0000_0001", "ours", 3, "c" * 64, before=other_writer_first)
    assert outcome is Outcome.ALREADY_PRESENT
    assert lost == [409]
    assert delta["resolved"] == 1 and delta["mismatch"] == 1
    assert get_manifest_entry(table, JOB, "0000_0001").uri == "theirs"
