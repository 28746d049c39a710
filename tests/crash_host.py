"""``python -m devhost`` with a real SIGKILL at one point of the mosaic's upload (crash tests only).

    python -m tests.crash_host POINT [--block-kib K] -- DEVHOST ARGS...

POINT says which storage request of the mosaic blob is never sent, because the process is
killed just before it:

- ``first-block``: the first Put Block (everything before streaming is done, nothing staged)
- ``block:N``: the N-th Put Block (N-1 were sent or are in flight on other threads)
- ``commit``: the Put Block List (every block staged, nothing committed)

or, for the coarse levels' reduction tree:

- ``level:N``: the N-th create-only Put Blob of a level intermediate (``levels/...``): its node
  has computed it, nothing of it is stored

or, for a backfill:

- ``start:N``: just after the starter started its N-th job (the job exists; the activity that
  started it has not reported)

or, for the local host itself:

- ``child-report``: a sub-orchestration's report to a parent in another host's partition (the
  child's last episode is committed, its report not yet sent)

The trigger wraps the blob SDK's ``stage_block`` and ``commit_block_list``: the kill itself
is real (``os.kill(getpid(), SIGKILL)``), so nothing runs after it, no ``finally``, no release.
``--block-kib`` shrinks the streamed mosaic's block size so a small test scene has many blocks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from azure.storage.blob import BlobClient

MOSAIC_SUFFIX = "/mosaic.tif"


def _kill() -> None:
    sys.stderr.write("crash_host: SIGKILL\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def install_child_report() -> None:
    """Wrap the host's sending of what an episode made (after its commit) so that a finished
    child's report to a parent this host does not own kills the process instead of leaving."""
    from devhost.durable.history import SUB_ORCHESTRATION_COMPLETED
    from devhost.durable.messaging import Messaging

    send_all = Messaging.send_all

    def sending(self, outbound):
        for message in outbound:
            if (
                message is not None
                and message[0] == "control"
                and message[2].get("item", {}).get("EventType") == SUB_ORCHESTRATION_COMPLETED
                and not self.partitions.owns_instance(message[1])
            ):
                _kill()
        return send_all(self, outbound)

    Messaging.send_all = sending


def install_job_start(n: int) -> None:
    """Wrap the starter so that its N-th job started kills the process once the start is made."""
    from client_functions import starter

    start_job = starter.start_job
    started = 0

    async def starting(*args, **kwargs):
        nonlocal started
        decision = await start_job(*args, **kwargs)
        if decision.action == "started":
            started += 1  # one event loop runs every start: no lock needed
            if started >= n:
                _kill()
        return decision

    starter.start_job = starting


def install_level_put(n: int) -> None:
    """Wrap the blob SDK's Put Blob so that the N-th of a level intermediate kills the process."""
    lock = threading.Lock()
    puts = 0
    upload_blob = BlobClient.upload_blob

    def uploading(self, *args, **kwargs):
        nonlocal puts
        if self.blob_name.startswith("levels/"):
            with lock:
                puts += 1
                if puts >= n:
                    _kill()
        return upload_blob(self, *args, **kwargs)

    BlobClient.upload_blob = uploading


def install(point: str) -> None:
    """Wrap the SDK so that the request named by ``point`` kills this process instead of leaving."""
    if point == "child-report":
        install_child_report()
        return
    if point.startswith("start:"):
        install_job_start(int(point.split(":", 1)[1]))
        return
    if point.startswith("level:"):
        install_level_put(int(point.split(":", 1)[1]))
        return
    if point == "first-block":
        kind, n = "block", 1
    elif point.startswith("block:"):
        kind, n = "block", int(point.split(":", 1)[1])
    elif point == "commit":
        kind, n = "commit", 0
    else:
        raise SystemExit(f"crash_host: unknown point {point!r}")
    lock = threading.Lock()
    staged = 0
    stage_block, commit_block_list = BlobClient.stage_block, BlobClient.commit_block_list
    stage_block_from_url = BlobClient.stage_block_from_url

    def count_block(self) -> None:
        nonlocal staged
        if kind == "block" and self.blob_name.endswith(MOSAIC_SUFFIX):
            with lock:
                staged += 1
                if staged >= n:
                    _kill()

    def staging(self, *args, **kwargs):
        count_block(self)
        return stage_block(self, *args, **kwargs)

    def staging_from_url(self, *args, **kwargs):
        count_block(self)  # a block the service copies counts like one sent from here
        return stage_block_from_url(self, *args, **kwargs)

    def committing(self, *args, **kwargs):
        if kind == "commit" and self.blob_name.endswith(MOSAIC_SUFFIX):
            _kill()
        return commit_block_list(self, *args, **kwargs)

    BlobClient.stage_block = staging
    BlobClient.stage_block_from_url = staging_from_url
    BlobClient.commit_block_list = committing


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m tests.crash_host")
    parser.add_argument("point")
    parser.add_argument("--block-kib", type=int, default=0)
    args = parser.parse_args(argv[:split])
    if args.block_kib:
        from tilecommit.raster.assembly import staging

        staging.STREAM_BLOCK_BYTES = args.block_kib * 1024
    install(args.point)
    from devhost.cli import main as devhost_main

    return devhost_main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
