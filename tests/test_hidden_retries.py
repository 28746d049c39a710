"""A write that landed is reported written, whichever layer resent it.

Each conditional write of the app goes through a fault proxy (testkit/storage_proxy.py) that lets
storage carry out the write and then loses its answer: a 500 OperationTimedOut after the write
(which Azure may answer when its own time ran out), or a reset connection. The app's clients are
built exactly as in production (tilecommit.storage, with their retry policies): the blob SDK and
azure-core resend the write, storage refuses the resend (409 or 412) because the first one
landed, and before the write id the gate reported that refusal as ``already-present`` or
``superseded``: a lost answer turned into a wrong outcome, and a repair's rebuild stopped. Now
each write stores its own write id and the refusal is checked against it.
"""

from __future__ import annotations

import hashlib

import pytest

from testkit import storage_ops as ops
from testkit.storage_proxy import BUSY, RESET_AFTER, TIMEOUT_AFTER, TIMEOUT_BEFORE, Episode, FaultPlan, FaultProxy
from tilecommit import conditional, gates, manifest
from tilecommit.gates import Outcome
from tilecommit.raster.assembly import attempt
from tilecommit.raster.assembly.staging import commit_staged_blob
from tilecommit.storage import StorageConnection

from .conftest import counter_total

JOB = "0123456789abcdef"
LOST_ANSWERS = [TIMEOUT_AFTER, RESET_AFTER]


def lose_first(operation: str, answer: str) -> FaultPlan:
    """The first request of ``operation`` is carried out by storage and its answer lost."""
    return FaultPlan(every=1, limit=1, answers=(answer,), operations=frozenset({operation}))


@pytest.fixture
def behind(azurite):
    """``behind(plan)``: a connection whose blob and table requests go through a FaultProxy with ``plan``."""
    proxies = []

    def connect(plan: FaultPlan) -> tuple[StorageConnection, FaultProxy, FaultProxy]:
        blobs = FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan).start()
        tables = FaultProxy(f"http://127.0.0.1:{azurite.table_port}", plan).start()
        proxies.extend([blobs, tables])
        connection = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{blobs.port}/")
        connection = connection.replace(f":{azurite.table_port}/", f":{tables.port}/")
        return StorageConnection.from_connection_string(connection), blobs, tables

    yield connect
    for proxy in proxies:
        proxy.stop()


def statuses(proxy: FaultProxy, method: str) -> list[int]:
    return [status for sent, _, status in proxy.carried_out if sent == method]


def written_and_refused(gate: str) -> tuple[int, int]:
    return (
        counter_total("ConditionalWrites", gate=gate, outcome="written"),
        counter_total("ConditionalWritePreconditionFailed", gate=gate),
    )


@pytest.mark.parametrize("answer", LOST_ANSWERS)
def test_a_tile_put_whose_answer_is_lost_is_written(behind, container, answer):
    connection, blobs, _ = behind(lose_first(ops.PUT_BLOB, answer))
    client = connection.blob_service().get_container_client(container.container_name)
    before = written_and_refused("tile")

    outcome = gates.commit_blob(client, f"tiles/{JOB}/0000_0000.tif", b"tile" * 100, job_id=JOB)

    assert outcome is Outcome.WRITTEN
    assert blobs.injected_by_operation[(ops.PUT_BLOB, answer)] == 1
    assert statuses(blobs, "PUT") == [201, 409]  # the SDK resent it, and storage refused the resend
    after = written_and_refused("tile")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)


@pytest.mark.parametrize("answer", LOST_ANSWERS)
def test_a_mosaic_commit_whose_answer_is_lost_is_written(behind, container, answer):
    connection, blobs, _ = behind(lose_first(ops.PUT_BLOCK_LIST, answer))
    client = connection.blob_service().get_container_client(container.container_name)
    blob = client.get_blob_client(f"mosaics/{JOB}/mosaic.tif")
    body = b"mosaic bytes" * 1000
    ids = [attempt.block_id(attempt.new_attempt_tag(), 0)]
    blob.stage_block(ids[0], body)
    digest = hashlib.sha256(body).hexdigest()

    outcome = commit_staged_blob(client, blob.blob_name, ids, sha256=digest, content_type="image/tiff", job_id=JOB)

    assert outcome is Outcome.WRITTEN
    assert blobs.injected_by_operation[(ops.PUT_BLOCK_LIST, answer)] == 1
    assert container.get_blob_client(blob.blob_name).download_blob().readall() == body


def committed_then_behind(behind, container, name: str, body: bytes, operation, answer):
    """``name`` committed with ``body``, then a client of its container whose first answer to
    ``operation`` is lost as ``answer`` says: (the committed ETag, that client, its blob proxy)."""
    assert gates.commit_blob(container, name, body) is Outcome.WRITTEN
    old = container.get_blob_client(name).get_blob_properties().etag
    connection, blobs, _ = behind(lose_first(operation, answer))
    return old, connection.blob_service().get_container_client(container.container_name), blobs


@pytest.mark.parametrize("answer", LOST_ANSWERS)
def test_a_mosaic_rebuild_whose_answer_is_lost_is_written_not_superseded(behind, container, answer):
    name = f"mosaics/{JOB}/mosaic.tif"
    old, client, blobs = committed_then_behind(behind, container, name, b"the old mosaic", ops.PUT_BLOCK_LIST, answer)
    body = b"the rebuilt mosaic" * 100
    ids = [attempt.block_id(attempt.new_attempt_tag(), 0)]
    client.get_blob_client(name).stage_block(ids[0], body)

    outcome = commit_staged_blob(
        client,
        name,
        ids,
        sha256=hashlib.sha256(body).hexdigest(),
        content_type="image/tiff",
        job_id=JOB,
        expect_etag=old,
    )

    assert outcome is Outcome.WRITTEN
    assert statuses(blobs, "PUT")[-2:] == [201, 412]
    assert container.get_blob_client(name).download_blob().readall() == body


@pytest.mark.parametrize("answer", LOST_ANSWERS)
def test_a_blob_repair_whose_answer_is_lost_is_written_with_its_new_etag(behind, container, answer):
    name = f"tiles/{JOB}/0000_0001.tif"
    old, client, blobs = committed_then_behind(behind, container, name, b"damaged", ops.PUT_BLOB, answer)
    before = counter_total("ConditionalWritePreconditionFailed", gate=gates.REPAIR_GATE)

    outcome, etag = gates.repair_blob_versioned(client, name, b"repaired" * 10, expect_etag=old, job_id=JOB)

    stored = container.get_blob_client(name).get_blob_properties()
    assert (outcome, etag) == (Outcome.WRITTEN, stored.etag)
    assert statuses(blobs, "PUT") == [201, 412]
    assert counter_total("ConditionalWritePreconditionFailed", gate=gates.REPAIR_GATE) == before


@pytest.mark.parametrize("answer", LOST_ANSWERS)
def test_a_manifest_row_whose_answer_is_lost_is_written(behind, table, answer):
    connection, _, tables = behind(lose_first(ops.INSERT_ENTITY, answer))
    client = connection.table_service().get_table_client(table.table_name)
    before = written_and_refused("manifest")

    outcome = manifest.record_manifest_entry(
        client, job_id=JOB, window="0000_0000", uri=f"tiles/{JOB}/0000_0000.tif", nbytes=10, sha256="ab" * 32
    )

    assert outcome is Outcome.WRITTEN
    assert tables.injected_by_operation[(ops.INSERT_ENTITY, answer)] == 1
    after = written_and_refused("manifest")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)


@pytest.mark.parametrize("answer", LOST_ANSWERS)
def test_a_manifest_repair_whose_answer_is_lost_is_written_not_superseded(behind, table, answer):
    args = {"job_id": JOB, "window": "0000_0001", "uri": f"tiles/{JOB}/0000_0001.tif", "nbytes": 10}
    assert manifest.record_manifest_entry(table, **args, sha256="aa" * 32) is Outcome.WRITTEN
    _, row_etag = manifest.get_manifest_row(table, JOB, "0000_0001")
    connection, _, tables = behind(lose_first(ops.UPDATE_ENTITY, answer))
    client = connection.table_service().get_table_client(table.table_name)

    outcome = manifest.repair_manifest_entry(client, **args, sha256="bb" * 32, etag="0x8DD", expect_row_etag=row_etag)

    assert outcome is Outcome.WRITTEN
    assert tables.injected_by_operation[(ops.UPDATE_ENTITY, answer)] == 1
    assert manifest.get_manifest_entry(table, JOB, "0000_0001").sha256 == "bb" * 32


def test_another_writers_identical_create_is_still_already_present(container):
    """The write id tells our write from an identical one of another writer: a digest cannot."""
    name = f"tiles/{JOB}/0000_0002.tif"
    assert gates.commit_blob(container, name, b"same bytes") is Outcome.WRITTEN
    assert gates.commit_blob(container, name, b"same bytes") is Outcome.ALREADY_PRESENT
    stored = container.get_blob_client(name).get_blob_properties().metadata
    assert len(stored[conditional.WRITE_ID_KEY]) == 16


def test_a_manifest_row_whose_answer_and_first_evidence_read_are_lost_is_written(behind, table):
    """The insert lands and its answer is a 500; the gate then reads what is stored to decide,
    and that read is refused too (a throttled partition). The outcome hangs on the read, so the
    gate reads again instead of raising a fault: raised, the activity's next attempt would find
    the row there and skip it, and the write that landed would never be counted written. The
    SDK's retries are off here, so the gate's own are what is shown."""
    plan = FaultPlan(
        episodes=[
            Episode(frozenset({ops.INSERT_ENTITY}), TIMEOUT_AFTER, 0.5),
            Episode(frozenset({ops.QUERY_ENTITIES}), BUSY, 0.5),
        ]
    )
    connection, _, tables = behind(plan)
    client = connection.table_service(retry_total=0).get_table_client(table.table_name)

    outcome = manifest.record_manifest_entry(
        client, job_id=JOB, window="0000_0003", uri=f"tiles/{JOB}/0000_0003.tif", nbytes=10, sha256="cd" * 32
    )

    assert outcome is Outcome.WRITTEN
    assert tables.injected_by_operation[(ops.QUERY_ENTITIES, BUSY)] >= 1


def test_the_table_client_retries_an_error_status_as_often_as_its_budget_says(behind, table):
    """azure-core caps retries after an error status at 3 unless told otherwise, whatever the
    total: the table client's budget (retries.TABLE_RETRIES) is set for each kind of retry."""
    manifest.record_manifest_entry(
        table, job_id=JOB, window="0000_0004", uri=f"tiles/{JOB}/0000_0004.tif", nbytes=10, sha256="ef" * 32
    )
    plan = FaultPlan(every=1, limit=4, answers=(TIMEOUT_BEFORE,), operations=frozenset({ops.QUERY_ENTITIES}))
    connection, _, tables = behind(plan)
    client = connection.table_service().get_table_client(table.table_name)

    assert manifest.get_manifest_entry(client, JOB, "0000_0004").sha256 == "ef" * 32
    assert tables.injected[TIMEOUT_BEFORE] == 4
