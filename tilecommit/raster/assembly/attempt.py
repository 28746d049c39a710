"""What one assembly attempt owns, so that attempts never need a claim to stay out of each other's way.

Assembly runs at least once: a retry after a crash, or a duplicate delivery running beside the
first. Nothing is locked. Each attempt instead:

- stages the mosaic's blocks under ids of its own (:func:`block_id`: a random tag per attempt for the blocks it sends
  plus the block's index), so its Put Block List names only blocks it staged itself, whatever
  another attempt, dead or alive, staged under its ids. The one create-only Put Block List
  (``If-None-Match: *``) then decides which attempt's mosaic exists; the other gets 409. Blocks
  the storage service copies from tiles are the exception: their bytes are named by the tile
  version and range they come from, so their ids come from those (:func:`content_tag`) and every
  attempt stages the same ids with the same bytes;
- writes its temporary files in a directory named after its process (:func:`new_workdir`), so
  the next attempt can tell a dead process's leftovers from a live neighbour's and remove them
  (:func:`sweep_dead_workdirs`).

Uncommitted blocks need no sweep: a Put Block List discards every uncommitted block of the blob
that it does not list, and the service drops uncommitted blocks after a week anyway. They are
bounded, though: a blob holds at most 100,000 (Put Block, remarks). The copied ranges, most of a
large mosaic's blocks, are staged under the same ids by every attempt, so attempts add only the
blocks they send themselves (the head and the coarse levels, or a streamed mosaic's 8 MiB
blocks), and a blob that has run out anyway is refused with the reason (``staging.staging_fault``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
import string
import tempfile

logger = logging.getLogger(__name__)

#: Characters of block ids: the URL-safe base64 alphabet, each one byte in the id the service sees.
TAG_ALPHABET = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
#: Characters of an attempt's tag: 64**5 = 2**30 tags, so two attempts on one mosaic share one
#: about once in a billion (4 characters of 36, before, about once in 1.7 million).
TAG_LENGTH = 5
#: Characters of a block's index, in the same alphabet: 64**3 = 262,144 blocks, above both the
#: 50,000 blocks a blob may commit and the 100,000 uncommitted ones it may hold.
INDEX_DIGITS = 3
MAX_BLOCKS = len(TAG_ALPHABET) ** INDEX_DIGITS
#: Every block id of every mosaic is this long, and must stay so: the service refuses (400
#: InvalidBlobOrBlock) a block whose id length differs from the blob's other blocks' (Put Block,
#: ``blockid``: "the length of the value ... must be the same size for each block"), for as long
#: as a blob keeps uncommitted blocks (a week after the last staging). An attempt of another
#: length, a dead one of an earlier version included, would lock every later attempt out.
BLOCK_ID_LENGTH = TAG_LENGTH + INDEX_DIGITS
#: Prefix of every attempt's temporary directory: ``tilecommit-{job_id}-{pid}-{random}``.
WORKDIR_PREFIX = "tilecommit-"
_WORKDIR = re.compile(r"^tilecommit-[0-9a-f]+-(\d+)-")


def new_attempt_tag() -> str:
    """A random tag for one attempt's block ids (not a secret: only distinct)."""
    return "".join(secrets.choice(TAG_ALPHABET) for _ in range(TAG_LENGTH))


def content_tag(*parts: str) -> str:
    """A tag that is a pure function of ``parts``: blocks whose bytes are named by the parts (a
    tile version, an offset, a length) get the same ids from every attempt, which restages them
    in place instead of adding a copy to the blob's uncommitted blocks."""
    digest = hashlib.sha256("\n".join(parts).encode()).digest()
    return "".join(TAG_ALPHABET[byte % len(TAG_ALPHABET)] for byte in digest[:TAG_LENGTH])


def _digits(index: int) -> str:
    chars = []
    for _ in range(INDEX_DIGITS):
        index, digit = divmod(index, len(TAG_ALPHABET))
        chars.append(TAG_ALPHABET[digit])
    return "".join(reversed(chars))


def block_id(tag: str, index: int) -> str:
    """The id of attempt ``tag``'s ``index``-th staged block, e.g. ``"k3Q9_AAq"`` (base64 on the wire)."""
    if not 0 <= index < MAX_BLOCKS:
        raise ValueError(f"block index {index} is outside 0..{MAX_BLOCKS - 1}")
    if len(tag) != TAG_LENGTH:
        raise ValueError(f"block tag {tag!r} is not {TAG_LENGTH} characters")
    return tag + _digits(index)


def new_workdir(job_id: str, root: str | None = None) -> str:
    """A fresh temporary directory for one attempt, named after this process."""
    return tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{job_id}-{os.getpid()}-", dir=root)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def sweep_dead_workdirs(root: str | None = None) -> list[str]:
    """Remove the attempt directories whose process is gone; returns what was removed.

    A killed worker leaves its directory (no ``finally`` runs after SIGKILL). When the instance
    is recycled the disk goes with it, but when only the worker process is restarted the next
    attempt finds it on a temporary disk that the Consumption plan limits to about 0.5 GB.
    Directories of live processes, this one included, are left alone: they may be a concurrent
    attempt's. This assumes that the processes sharing the temporary directory see one another's
    process ids (one machine or one container), as the workers of a Functions instance do.
    """
    root = root or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _WORKDIR.match(name)
        if not match or _process_alive(int(match.group(1))):
            continue
        path = os.path.join(root, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    if removed:
        logger.info("removed %d temporary directories of dead assembly attempts: %s", len(removed), removed)
    return removed
