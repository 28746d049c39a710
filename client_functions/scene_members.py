"""The starter's look at a scene document: its members, and each one's version, when it arrives.

A scene document (tilecommit/scene_documents.py) is read here once, pinned to the ETag of the
event's version and only when it is small enough to be one, to find the versions of the band
files it names: the job id covers every one (tilecommit/jobs.py ``job_id_for``), and every
activity reads those versions alone. A member that does not exist yet is recorded as missing;
the job then fails once, naming it, and the document's next version (uploaded again once every
member is in) is a new job. A document that is not valid starts its job with no members: its
validation refuses it, saying why, as it refuses any upload.
"""

from __future__ import annotations

from azure.core import MatchConditions
from azure.storage.blob import BlobClient, BlobProperties, ContainerClient

from tilecommit.errors import BadInputError
from tilecommit.jobs import SceneMember
from tilecommit.scene_documents import MAX_DOCUMENT_BYTES, looks_like_document, parse_document
from tilecommit.storage import readable_blob_name
from tilecommit.storage_answers import STORAGE_ERRORS, call_failed, classify, unless_missing


def scene_members(source: BlobClient, props: BlobProperties, uploads: ContainerClient) -> list[SceneMember] | None:
    """The members of the document ``source`` at the version ``props`` describe, each with the
    ETag storage holds now (None: missing), read from ``uploads`` (the document's container);
    None when ``source`` is no valid scene document."""
    if props.size > MAX_DOCUMENT_BYTES:
        return None  # not a document the starter reads; one that is JSON is refused by its validation
    try:
        body = source.download_blob(
            offset=0,
            length=props.size,
            max_concurrency=1,
            etag=props.etag,
            match_condition=MatchConditions.IfNotModified,
        ).readall()
    except STORAGE_ERRORS as exc:
        if classify(exc).version_gone:
            return None  # overwritten or deleted since: its job fails saying so, the new version has its own
        raise call_failed("reading the scene document", source.blob_name, exc) from exc
    if not looks_like_document(body[:64]):
        return None
    try:
        document = parse_document(source.blob_name, body, props.size)
    except BadInputError:
        return None
    members = []
    for band in document.bands:
        member = uploads.get_blob_client(readable_blob_name(band.blob))
        found = unless_missing("reading the properties of member", band.blob, member.get_blob_properties)
        members.append(SceneMember(band.blob, member.url, found.etag.strip('"') if found is not None else None))
    return members
