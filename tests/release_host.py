"""``python -m devhost`` running a chosen release of the app, optionally killed at an exact point
(tests/test_versions.py only).

    python -m tests.release_host [--release MODULE] [--crash-at-row N] -- DEVHOST ARGS...

``--release``: a module of ``tests/apps`` imported first, which changes the code and host.json
settings the host then loads (``tests/apps/next_release.py``); without it, this release.
``--crash-at-row``: the process kills itself with SIGKILL when its N-th manifest row is about
to be written (tests/crashing_host.py), so a job is left mid-way.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tests import crashing_host


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m tests.release_host")
    parser.add_argument("--release", help="module of tests/apps that makes the next release")
    parser.add_argument("--crash-at-row", type=int, help="SIGKILL at the N-th manifest row")
    options = parser.parse_args(argv[:split])
    if options.crash_at_row:  # first: the manifest's writer is replaced before anything imports it
        crashing_host.install(options.crash_at_row)
    if options.release:
        importlib.import_module(options.release)
    from devhost.cli import main as devhost_main

    return devhost_main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
