"""S3 objects and DynamoDB items, created once (and S3 objects replaced once), on the one protocol.

- **S3 create**: one PutObject with ``If-None-Match: *``. Refusals that mean the key is taken:
  412 ``PreconditionFailed``, and 409 ``ConditionalRequestConflict`` (another conditional write
  to the key in flight; AWS's "Conditional requests" guide says to retry it, and the retry would
  be refused with 412: the key is taken either way). One request only: PutObject is never split
  (multipart is a client's choice, UploadPart carries no condition), and a body above one
  PutObject's 5 GiB is refused before any request.
- **S3 replace**: PutObject with ``If-Match: <ETag inspected>``; 412 ``PreconditionFailed`` or 404
  ``NoSuchKey`` is ``SUPERSEDED``.
- **DynamoDB create**: PutItem with ``attribute_not_exists`` on the partition and the sort key;
  ``ConditionalCheckFailedException`` is the key taken.

The evidence is the body's sha256, in the object's metadata (``x-amz-meta-sha256``) or the
item's ``sha256`` attribute, written by the same request; it is read back with HeadObject or a
strongly consistent GetItem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from tilecommit import conditional
from tilecommit.conditional import Outcome, Stored
from tilecommit.errors import BodyTooLargeError, StorageFaultError
from tilecommit.gates import sha256_hex
from tilecommit.storage_answers import answered, storage_fault

#: The largest body one PutObject takes.
MAX_PUT_OBJECT_BYTES = 5 * 1024**3
#: The metadata key (``x-amz-meta-sha256``) and item attribute holding the evidence.
DIGEST_KEY = "sha256"
#: A request sent and no answer read: connection refused, reset or timed out.
UNANSWERED = (BotoConnectionError, HTTPClientError)


def _answer(exc: BaseException) -> tuple[int | None, str | None]:
    if not isinstance(exc, ClientError):
        return None, None
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"), exc.response.get("Error", {}).get("Code")


@dataclass
class _AwsWrite:
    key: str
    #: No write id is stored here: the content's digest is the only evidence (conditional.Backend).
    write_id = None

    def unanswered(self, exc: BaseException) -> bool:
        return isinstance(exc, UNANSWERED)

    def status(self, exc: BaseException) -> int | None:
        return _answer(exc)[0]

    def fault(self, exc: BaseException) -> StorageFaultError:
        status, code = _answer(exc)
        return storage_fault(
            f"writing {self.key!r} failed: {code or type(exc).__name__}: {exc}", answered(status, code)
        )


@dataclass
class S3Put(_AwsWrite):
    client: Any
    bucket: str
    name: str
    body: bytes
    digest: str
    expect_etag: str | None = None

    def send(self) -> None:
        condition = {"IfNoneMatch": "*"} if self.expect_etag is None else {"IfMatch": self.expect_etag}
        self.client.put_object(
            Bucket=self.bucket, Key=self.name, Body=self.body, Metadata={DIGEST_KEY: self.digest}, **condition
        )

    def refused(self, exc: BaseException) -> bool:
        answer = _answer(exc)
        if self.expect_etag is None:
            return answer in ((412, "PreconditionFailed"), (409, "ConditionalRequestConflict"))
        return answer in ((412, "PreconditionFailed"), (404, "NoSuchKey"), (409, "ConditionalRequestConflict"))

    def stored(self) -> Stored:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.name)
        except ClientError as exc:
            if _answer(exc)[0] == 404:
                return conditional.ABSENT
            raise self.fault(exc) from exc
        except UNANSWERED as exc:
            raise self.fault(exc) from exc
        return Stored(True, (head.get("Metadata") or {}).get(DIGEST_KEY), head["ETag"])


def _s3_put(client, bucket: str, name: str, body: bytes, expect_etag: str | None) -> tuple[S3Put, str]:
    body = bytes(body)
    if len(body) > MAX_PUT_OBJECT_BYTES:
        raise BodyTooLargeError(
            f"s3://{bucket}/{name}: {len(body)} bytes is more than one PutObject takes ({MAX_PUT_OBJECT_BYTES}); "
            "a multipart upload's parts carry no condition"
        )
    digest = sha256_hex(body)
    return S3Put(f"s3://{bucket}/{name}", client, bucket, name, body, digest, expect_etag), digest


def commit_object(client, bucket: str, name: str, body: bytes, *, job_id: str = "", gate: str = "s3") -> Outcome:
    """Create ``name`` with ``body`` only if the key is free: ``WRITTEN`` or ``ALREADY_PRESENT``."""
    write, digest = _s3_put(client, bucket, name, body, None)
    return conditional.create_once(write, digest=digest, gate=gate, job_id=job_id)


def repair_object(
    client, bucket: str, name: str, body: bytes, *, expect_etag: str, job_id: str = "", gate: str = "s3-repair"
) -> Outcome:
    """Replace exactly the version ``expect_etag`` of ``name``: ``WRITTEN`` or ``SUPERSEDED``."""
    write, digest = _s3_put(client, bucket, name, body, expect_etag)
    return conditional.replace_once(write, expect_version=expect_etag, digest=digest, gate=gate, job_id=job_id)


@dataclass
class DynamoPut(_AwsWrite):
    client: Any
    table: str
    item: dict
    keys: tuple[str, str]

    def send(self) -> None:
        partition, sort = self.keys
        self.client.put_item(
            TableName=self.table,
            Item=self.item,
            ConditionExpression="attribute_not_exists(#pk) AND attribute_not_exists(#sk)",
            ExpressionAttributeNames={"#pk": partition, "#sk": sort},
        )

    def refused(self, exc: BaseException) -> bool:
        return _answer(exc)[1] == "ConditionalCheckFailedException"

    def stored(self) -> Stored:
        key = {name: self.item[name] for name in self.keys}
        try:
            found = self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        except (ClientError, *UNANSWERED) as exc:
            raise self.fault(exc) from exc
        if found is None:
            return conditional.ABSENT
        return Stored(True, found.get(DIGEST_KEY, {}).get("S"))


def create_item(
    client, table: str, item: dict, *, keys: tuple[str, str], job_id: str = "", gate: str = "dynamodb"
) -> Outcome:
    """Put ``item`` (DynamoDB's attribute-value form) only if no item has its two keys. Its
    ``sha256`` attribute, when it has one, is the evidence."""
    digest = item.get(DIGEST_KEY, {}).get("S")
    write = DynamoPut(f"dynamodb://{table}/{'/'.join(item[k]['S'] for k in keys)}", client, table, item, keys)
    return conditional.create_once(write, digest=digest, gate=gate, job_id=job_id)
