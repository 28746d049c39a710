"""Cloud Storage objects created once (``ifGenerationMatch=0``) and replaced once
(``ifGenerationMatch=<generation inspected>``), on the one protocol.

Why the upload is our own request: google-cloud-storage sends a body of more than 8 MiB
(``google.cloud.storage.blob._MAX_MULTIPART_SIZE``) as a resumable upload, and a resumable
session checks its preconditions when the session is created, not when the object is finished:
two writers can each open a session while the key is free. So every body here goes up as one
multipart request of the JSON API (``uploadType=multipart``, Google's "Uploading objects" docs)
with the precondition in it, whatever its size (a single request takes up to 5 TiB), and the
service evaluates the condition as it creates the object: 412 is the key taken (or, for a
replace, another generation); 404 on a replace is the object gone.

The evidence is the body's sha256 in the object's metadata, written by the same request and
read back with the client library (``Bucket.get_blob``: its generation and metadata).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import requests

from tilecommit import conditional
from tilecommit.conditional import Outcome, Stored
from tilecommit.errors import StorageFaultError
from tilecommit.gates import sha256_hex
from tilecommit.storage_answers import answered, storage_fault

DIGEST_KEY = "sha256"
UNANSWERED = (requests.ConnectionError, requests.Timeout)


@dataclass
class GcsUpload:
    key: str
    #: No write id is stored here: the content's digest is the only evidence (conditional.Backend).
    write_id = None
    session: Any
    api_endpoint: str
    bucket: Any
    name: str
    body: bytes
    digest: str
    content_type: str = "application/octet-stream"
    expect_generation: str | None = None

    def send(self) -> None:
        boundary = f"tilecommit-{uuid.uuid4().hex}"
        metadata = json.dumps(
            {"name": self.name, "contentType": self.content_type, "metadata": {DIGEST_KEY: self.digest}}
        )
        head = (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
            f"--{boundary}\r\nContent-Type: {self.content_type}\r\n\r\n"
        ).encode()
        answer = self.session.post(
            f"{self.api_endpoint}/upload/storage/v1/b/{self.bucket.name}/o",
            params={"uploadType": "multipart", "ifGenerationMatch": self.expect_generation or "0"},
            data=head + self.body + f"\r\n--{boundary}--\r\n".encode(),
            headers={"Content-Type": f"multipart/related; boundary={boundary}"},
            timeout=120,
        )
        answer.raise_for_status()

    def refused(self, exc: BaseException) -> bool:
        if not isinstance(exc, requests.HTTPError) or exc.response is None:
            return False
        return exc.response.status_code == 412 or (
            self.expect_generation is not None and exc.response.status_code == 404
        )

    def unanswered(self, exc: BaseException) -> bool:
        return isinstance(exc, UNANSWERED)

    def status(self, exc: BaseException) -> int | None:
        response = getattr(exc, "response", None)
        return getattr(response, "status_code", None)

    def fault(self, exc: BaseException) -> StorageFaultError:
        return storage_fault(f"writing {self.key!r} failed: {exc}", answered(self.status(exc)))

    def stored(self) -> Stored:
        try:
            blob = self.bucket.get_blob(self.name)
        except Exception as exc:  # noqa: BLE001 - any failure to read the evidence is a storage fault
            raise storage_fault(f"reading {self.key!r} failed: {exc}") from exc
        if blob is None:
            return conditional.ABSENT
        return Stored(True, (blob.metadata or {}).get(DIGEST_KEY), str(blob.generation))


def _upload(bucket, name: str, body: bytes, session, api_endpoint: str, expect_generation: str | None):
    body = bytes(body)
    digest = sha256_hex(body)
    key = f"gs://{bucket.name}/{name}"
    return GcsUpload(
        key, session, api_endpoint.rstrip("/"), bucket, name, body, digest, expect_generation=expect_generation
    ), digest


def commit_object(
    bucket, name: str, body: bytes, *, session, api_endpoint: str, job_id: str = "", gate: str = "gcs"
) -> Outcome:
    """Create ``name`` in ``bucket`` (a google.cloud.storage Bucket, for the evidence) with
    ``body`` only if no generation exists: one request through ``session`` (an authorized
    requests session) to ``api_endpoint``. ``WRITTEN`` or ``ALREADY_PRESENT``."""
    upload, digest = _upload(bucket, name, body, session, api_endpoint, None)
    return conditional.create_once(upload, digest=digest, gate=gate, job_id=job_id)


def repair_object(
    bucket,
    name: str,
    body: bytes,
    *,
    expect_generation: str,
    session,
    api_endpoint: str,
    job_id: str = "",
    gate: str = "gcs-repair",
) -> Outcome:
    """Replace exactly the generation ``expect_generation`` of ``name``: ``WRITTEN`` or ``SUPERSEDED``."""
    upload, digest = _upload(bucket, name, body, session, api_endpoint, expect_generation)
    return conditional.replace_once(upload, expect_version=expect_generation, digest=digest, gate=gate, job_id=job_id)
