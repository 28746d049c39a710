"""Which collection an upload joins, and what a collection id may be: pure, no I/O (the starter
resolves it into the job, tilecommit/jobs.py; settings.py checks the settings with it).

The choice follows the output profile's precedence (tilecommit/profiles.py):

1. the upload's blob metadata ``tilecommit_collection``;
2. the first rule of ``TILECOMMIT_COLLECTION_RULES`` whose prefix the upload's name starts with
   (``dem/=elevation;previews/=quicklooks``; the longest prefix wins);
3. the app's default, ``TILECOMMIT_COLLECTION`` (:data:`DEFAULT_COLLECTION`).

A collection id is 1 to 64 characters of lower-case ASCII letters, digits, ``-`` and ``_``,
beginning with a letter or a digit. That is what STAC's best practices advise for ids that end up
in URLs (no ``:`` or ``/``), narrowed so the id is one blob-name segment and one pgstac
collection id as it is: no case folding (two ids differing only by case would be two pgstac
collections but look like one), no dots (no ``.`` or ``..`` segment).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import BadInputError, ConfigurationError

#: The collection of uploads that name none and match no rule.
DEFAULT_COLLECTION = "tilecommit"
#: The upload's blob metadata key naming its collection.
METADATA_COLLECTION = "tilecommit_collection"
MAX_ID_CHARS = 64
_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ACCEPTED = "1 to 64 characters of a-z, 0-9, '-' and '_', beginning with a letter or a digit"


def check_collection_id(value: str, *, where: str, error: type[BadInputError] = BadInputError) -> str:
    """``value`` when it is a collection id (the module's rule), else ``error`` naming ``where``
    (the metadata key or the setting) and the value."""
    if not isinstance(value, str) or not _ID.fullmatch(value):  # fullmatch: '$' would allow a final newline
        raise error(f"{where}={value!r} is not a collection id: expected {ACCEPTED}")
    return value


def parse_rules(text: str, *, where: str) -> list[tuple[str, str]]:
    """``prefix=collection;...`` as (prefix, collection), the longest prefix first."""
    rules = []
    for rule in filter(None, (r.strip() for r in text.split(";"))):
        prefix, sep, collection = rule.partition("=")
        if not sep or not prefix.strip():
            raise ConfigurationError(f"{where}: rule {rule!r} is not prefix=collection")
        checked = check_collection_id(
            collection.strip(), where=f"{where} rule {prefix.strip()!r}", error=ConfigurationError
        )
        rules.append((prefix.strip(), checked))
    return sorted(rules, key=lambda r: -len(r[0]))


def resolve(metadata: Mapping[str, str] | None, blob_name: str, *, rules: list[tuple[str, str]], default: str) -> str:
    """The collection of one upload: its metadata's, else its path rule's, else the default.

    Raises :class:`BadInputError` for metadata naming no valid id: that upload's job fails at once,
    saying which key and which value.
    """
    given = {k.lower(): v for k, v in (metadata or {}).items()}
    if METADATA_COLLECTION in given:
        return check_collection_id(given[METADATA_COLLECTION].strip(), where=f"blob metadata {METADATA_COLLECTION}")
    for prefix, collection in rules:
        if blob_name.startswith(prefix):
            return collection
    return default
