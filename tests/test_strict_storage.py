"""The strict storage every test runs against (testkit/strict_storage.py): each Azure rule that
Azurite lacks is refused with Azure's status and code through it, and accepted by the bare Azurite
behind it, which is why the rule is enforced here (docs/faults.md, "What Azure does and Azurite
doesn't"). Then the fault answers the proxy gives per REST operation.
"""

from __future__ import annotations

import base64

import pytest
from azure.core.exceptions import HttpResponseError, ServiceResponseError
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.blob import BlobServiceClient

from testkit import storage_ops as ops
from testkit.azure_rules import AzureRules
from testkit.storage_proxy import BUSY, CANNOT_VERIFY, RESET_AFTER, TIMEOUT_AFTER, FaultPlan, FaultProxy
from tilecommit import gates


def bare(azurite) -> str:
    """The connection string of the Azurite behind the strict proxies."""
    return azurite.emulator.connection_string


def refusal(call) -> tuple[int, str] | None:
    """(status, error code) of the refusal ``call()`` met, or None when it was served."""
    try:
        call()
    except HttpResponseError as exc:
        return exc.status_code, gates.error_code(exc)
    return None


def both(azurite, container_name: str, act) -> tuple:
    """``act(container_client)`` through the strict storage and against the bare Azurite."""
    strict = BlobServiceClient.from_connection_string(azurite.connection_string)
    plain = BlobServiceClient.from_connection_string(bare(azurite))
    return (
        refusal(lambda: act(strict.get_container_client(container_name))),
        refusal(lambda: act(plain.get_container_client(container_name))),
    )


# ----------------------------------------------------------------------------- blob rules


def test_block_ids_of_one_blob_must_have_one_length(azurite, container):
    def stage_two_lengths(client):
        blob = client.get_blob_client(f"mixed-{client.url[-6:]}")
        blob.stage_block("aaaaaaaa", b"x")
        blob.stage_block("bbbbbbbbbbbbbbbb", b"y")

    strict, plain = both(azurite, container.container_name, stage_two_lengths)
    # Azurite has this rule too (for the uncommitted blocks), so the app's own tests always met it.
    assert strict == plain == (400, "InvalidBlobOrBlock")


def test_a_commit_discards_the_uncommitted_blocks_and_with_them_their_length(container):
    blob = container.get_blob_client("relength.tif")
    blob.stage_block("aaaaaaaa", b"x")
    blob.stage_block("aaaaaaab", b"y")
    blob.commit_block_list(["aaaaaaaa"])  # aaaaaaab is discarded
    blob.upload_blob(b"whole", overwrite=True)  # Put Blob: no blocks left at all
    blob.stage_block("cccccccccccc", b"z")  # another length, now alone on the blob
    assert refusal(lambda: blob.stage_block("dddddddd", b"w")) == (400, "InvalidBlobOrBlock")


def test_a_block_list_of_mixed_lengths_is_invalid(azurite, container):
    def commit_mixed(client):
        blob = client.get_blob_client(f"list-{client.url[-6:]}")
        blob.stage_block("aaaaaaaa", b"x")
        blob.commit_block_list(["aaaaaaaa"])
        blob.stage_block("aaaaaaab", b"y")
        # A list naming ids of two lengths (one committed before, one never staged in this length).
        blob.commit_block_list(["aaaaaaaa", "aaaaaaab", "bb"])

    strict, plain = both(azurite, container.container_name, commit_mixed)
    assert strict == (400, "InvalidBlockList")
    assert plain == (400, "InvalidBlockList")  # Azurite: "bb" was never staged


def test_block_ids_longer_than_64_bytes_are_refused(container):
    blob = container.get_blob_client("long-id.tif")
    assert refusal(lambda: blob.stage_block("x" * 65, b"x"))[0] == 400
    assert refusal(lambda: blob.stage_block("x" * 64, b"x")) is None


def test_a_block_list_longer_than_50000_blocks_is_refused(azurite, container):
    def commit_too_many(client):
        blob = client.get_blob_client(f"many-{client.url[-6:]}")
        blob.stage_block("aaaaaaaa", b"x")
        blob.commit_block_list(["aaaaaaaa"] * 50_001)

    strict, plain = both(azurite, container.container_name, commit_too_many)
    assert strict == (400, "BlockListTooLong")
    assert plain is None  # Azurite commits it


def test_a_read_pinned_to_an_etag_of_a_missing_blob_is_not_found_as_on_azure(azurite, container):
    """Azure answers a GET or HEAD with ``If-Match`` of a blob that does not exist 404
    ``BlobNotFound``; Azurite 3.37 412 ``ConditionNotMet``, which reads as "another version"."""
    from azure.core import MatchConditions

    etag = container.upload_blob("present", b"x").get_blob_properties().etag
    pinned = {"etag": etag, "match_condition": MatchConditions.IfNotModified}

    def read(client):
        client.download_blob("missing", **pinned).readall()

    def head(client):
        client.get_blob_client("missing").get_blob_properties(**pinned)

    assert both(azurite, container.container_name, read) == ((404, "BlobNotFound"), (412, "ConditionNotMet"))
    strict, plain = both(azurite, container.container_name, head)
    assert strict[0] == 404 and plain[0] == 412  # a HEAD's answer has no body: the status says it
    # A blob that exists at another version is still refused 412 through the proxy.
    container.upload_blob("present", b"y", overwrite=True)
    strict, plain = both(azurite, container.container_name, lambda c: c.download_blob("present", **pinned).readall())
    assert strict == plain == (412, "ConditionNotMet")


def test_a_blob_name_over_1024_characters_is_refused(azurite, container):
    strict, plain = both(azurite, container.container_name, lambda c: c.upload_blob("n" * 1025, b"x"))
    assert strict[0] == 400
    assert plain is None


def test_at_most_100000_uncommitted_blocks_a_blob():
    """The bookkeeping alone (100,000 requests would take minutes): the 100,001st distinct block
    is refused with 409 BlockCountExceedsLimit, a block staged again under an id already there is not."""
    rules = AzureRules()

    def put_block(index: int):
        block = base64.b64encode(f"{index:08d}".encode()).decode()
        return ops.parse("blob", "PUT", f"/acct/c/b?comp=block&blockid={block}", {"Content-Length": "1"})

    for index in range(100_000):
        assert rules.check(put_block(index), b"x") is None
        rules.carried_out(put_block(index), b"x")
    assert rules.check(put_block(7), b"x") is None
    refused = rules.check(put_block(100_000), b"x")
    assert (refused.status, refused.code) == (409, "BlockCountExceedsLimit")


def test_metadata_over_8_kib_is_refused(azurite, container):
    def put_with_metadata(client):
        client.get_blob_client(f"meta-{client.url[-6:]}").upload_blob(b"x", metadata={"big": "v" * 8200})

    strict, plain = both(azurite, container.container_name, put_with_metadata)
    assert strict == (400, "MetadataTooLarge")
    assert plain is None


# ----------------------------------------------------------------------------- table rules


def both_tables(azurite, table_name: str, act) -> tuple:
    strict = TableServiceClient.from_connection_string(azurite.connection_string).get_table_client(table_name)
    plain = TableServiceClient.from_connection_string(bare(azurite)).get_table_client(table_name)
    return refusal(lambda: act(strict)), refusal(lambda: act(plain))


@pytest.mark.parametrize(
    ("entity", "code", "azurite_has_it"),
    [
        ({"PartitionKey": "p", "RowKey": "big", "v": "x" * 40_000}, "PropertyValueTooLarge", True),
        (
            {"PartitionKey": "p", "RowKey": "wide", **{f"p{i}": "x" * 30_000 for i in range(20)}},
            "EntityTooLarge",
            False,
        ),
        ({"PartitionKey": "p", "RowKey": "many", **{f"p{i}": i for i in range(253)}}, "TooManyProperties", False),
        ({"PartitionKey": "p", "RowKey": "name", "n" * 256: 1}, "PropertyNameTooLong", False),
    ],
)
def test_entity_limits(azurite, table, entity, code, azurite_has_it):
    strict, plain = both_tables(azurite, table.table_name, lambda client: client.create_entity(entity))
    assert strict == (400, code)
    assert (plain is not None) is azurite_has_it


def test_a_batch_of_more_than_100_operations_or_two_partitions_is_refused(azurite, table):
    many = [("create", {"PartitionKey": "p", "RowKey": f"r{i:03d}"}) for i in range(101)]
    mixed = [("create", {"PartitionKey": "p", "RowKey": "a"}), ("create", {"PartitionKey": "q", "RowKey": "b"})]
    twice = [("create", {"PartitionKey": "p", "RowKey": "c"}), ("upsert", {"PartitionKey": "p", "RowKey": "c"})]
    strict = TableClient.from_connection_string(azurite.connection_string, table.table_name)
    assert refusal(lambda: strict.submit_transaction(many)) == (400, "InvalidInput")
    with pytest.raises(ValueError, match="Partition Keys"):  # the SDK refuses this one before sending
        strict.submit_transaction(mixed)
    assert refusal(lambda: strict.submit_transaction(twice)) == (400, "InvalidDuplicateRow")
    assert refusal(lambda: strict.submit_transaction(many[:100])) is None


# ----------------------------------------------------------------------------- fault answers


def test_each_operation_is_told_apart():
    def kind(service, method, target, **headers):
        return ops.operation(ops.parse(service, method, target, headers))

    assert kind("blob", "PUT", "/a/c/b.tif", **{"x-ms-blob-type": "BlockBlob"}) == ops.PUT_BLOB
    assert kind("blob", "PUT", "/a/c/b.tif?comp=block&blockid=QQ%3D%3D") == ops.PUT_BLOCK
    assert kind("blob", "PUT", "/a/c/b.tif?comp=block&blockid=QQ%3D%3D", **{"x-ms-copy-source": "u"}) == (
        ops.PUT_BLOCK_FROM_URL
    )
    assert kind("blob", "PUT", "/a/c/d/b.tif?comp=blocklist") == ops.PUT_BLOCK_LIST
    assert kind("blob", "GET", "/a/c/b.tif") == ops.GET_BLOB
    assert kind("blob", "HEAD", "/a/c/b.tif") == ops.GET_BLOB_PROPERTIES
    assert kind("blob", "GET", "/a/c?restype=container&comp=list") == ops.LIST_BLOBS
    assert kind("table", "POST", "/a/t") == ops.INSERT_ENTITY
    assert kind("table", "PUT", "/a/t(PartitionKey='p',RowKey='r')", **{"If-Match": "e"}) == ops.UPDATE_ENTITY
    assert kind("table", "PUT", "/a/t(PartitionKey='p',RowKey='r')") == ops.INSERT_OR_REPLACE_ENTITY
    assert kind("table", "DELETE", "/a/t(PartitionKey='p',RowKey='r')", **{"If-Match": "*"}) == ops.DELETE_ENTITY
    assert kind("table", "GET", "/a/t()?$filter=x") == ops.QUERY_ENTITIES
    assert kind("table", "POST", "/a/$batch") == ops.ENTITY_GROUP_TRANSACTION


@pytest.mark.parametrize("answer", [TIMEOUT_AFTER, RESET_AFTER])
def test_an_answer_lost_after_the_write_leaves_it_carried_out(azurite, container, answer):
    plan = FaultPlan(every=1, limit=1, answers=(answer,), operations=frozenset({ops.PUT_BLOB}))
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        connection = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        client = BlobServiceClient.from_connection_string(connection, retry_total=0)
        blob = client.get_container_client(container.container_name).get_blob_client("lost.tif")
        try:
            blob.upload_blob(b"landed")
            answered = "created"
        except HttpResponseError as exc:
            answered = (exc.status_code, gates.error_code(exc))
        except ServiceResponseError:
            answered = "no answer"
        assert answered == {TIMEOUT_AFTER: (500, "OperationTimedOut"), RESET_AFTER: "no answer"}[answer]
    assert container.get_blob_client("lost.tif").download_blob().readall() == b"landed"
    assert proxy.injected_by_operation[(ops.PUT_BLOB, answer)] == 1


def test_busy_and_cannot_verify_answers_carry_azures_codes_and_nothing_is_carried_out(azurite, container):
    plan = FaultPlan(every=1, answers=(BUSY, CANNOT_VERIFY), operations=frozenset({ops.PUT_BLOB}), seed=3)
    with FaultProxy(f"http://127.0.0.1:{azurite.blob_port}", plan) as proxy:
        connection = azurite.connection_string.replace(f":{azurite.blob_port}/", f":{proxy.port}/")
        client = BlobServiceClient.from_connection_string(connection, retry_total=0)
        blob = client.get_container_client(container.container_name).get_blob_client("busy.tif")
        # CannotVerifyCopySource fits only a Put Block From URL: every Put Blob is answered busy.
        assert refusal(lambda: blob.upload_blob(b"never")) == (503, "ServerBusy")
    assert proxy.carried_out == [] and proxy.injected == {BUSY: 1}
    assert not container.get_blob_client("busy.tif").exists()


def test_an_azurite_whose_port_was_taken_meanwhile_starts_on_other_ports(monkeypatch):
    """Ports are found free, then bound by Azurite a moment later; in between another process (a
    proxy of another test worker, another Azurite) can take one, and Azurite exits with code 1
    (EADDRINUSE). Seen once in a full run, which lost a whole test module. It starts again on
    fresh ports."""
    import socket

    from devhost import azurite as emulator

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    found = iter([taken.getsockname()[1]])
    fresh = emulator._free_port
    monkeypatch.setattr(emulator, "_free_port", lambda: next(found, None) or fresh())
    try:
        with emulator.Azurite() as started:
            assert taken.getsockname()[1] not in (started.blob_port, started.queue_port, started.table_port)
            BlobServiceClient.from_connection_string(started.connection_string).create_container("started")
    finally:
        taken.close()
