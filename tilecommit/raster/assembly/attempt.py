"""What one assembly attempt owns, so that attempts never need a claim to stay out of each other's way.

Assembly runs at least once: a retry after a crash, or a duplicate delivery running beside the
first. Nothing is locked. Each attempt instead:

- stages the mosaic's blocks under ids of its own (:func:`block_id`: a random tag per attempt
  plus the block's index), so its Put Block List names only blocks it staged itself, whatever
  another attempt, dead or alive, staged under its ids. The one create-only Put Block List
  (``If-None-Match: *``) then decides which attempt's mosaic exists; the other gets 409;
- writes its temporary files in a directory named after its process (:func:`new_workdir`), so
  the next attempt can tell a dead process's leftovers from a live neighbour's and remove them
  (:func:`sweep_dead_workdirs`).

Uncommitted blocks need no sweep: a Put Block List discards every uncommitted block of the blob
that it does not list, and the service drops uncommitted blocks after a week anyway.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import string
import tempfile

logger = logging.getLogger(__name__)

#: Characters of an attempt's tag. 36**4 tags: two attempts share one about once in 1.7 million.
TAG_ALPHABET = string.ascii_lowercase + string.digits
TAG_LENGTH = 4
#: Hex digits of a block's index: 16**4 blocks, above the 50,000 blocks a blob may commit.
INDEX_DIGITS = 4
MAX_BLOCKS = 16**INDEX_DIGITS
#: Every block id is this long. The service refuses (400 InvalidBlobOrBlock) a Put Block whose id
#: length differs from the blob's uncommitted blocks', so it stays at 8, the length of the ids
#: used before tags: an earlier version's dead attempt cannot block this one for a week.
BLOCK_ID_LENGTH = TAG_LENGTH + INDEX_DIGITS
#: Prefix of every attempt's temporary directory: ``tilecommit-{job_id}-{pid}-{random}``.
WORKDIR_PREFIX = "tilecommit-"
_WORKDIR = re.compile(r"^tilecommit-[0-9a-f]+-(\d+)-")


def new_attempt_tag() -> str:
    """A random tag for one attempt's block ids (not a secret: only distinct)."""
    return "".join(secrets.choice(TAG_ALPHABET) for _ in range(TAG_LENGTH))


def block_id(tag: str, index: int) -> str:
    """The id of attempt ``tag``'s ``index``-th staged block, e.g. ``"k3q9002a"`` (base64 on the wire)."""
    if not 0 <= index < MAX_BLOCKS:
        raise ValueError(f"block index {index} is outside 0..{MAX_BLOCKS - 1}")
    return f"{tag}{index:0{INDEX_DIGITS}x}"


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
    removed = []
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
