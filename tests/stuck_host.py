"""``python -m devhost`` with one tile activity stuck for good (host-limit tests only).

    python -m tests.stuck_host WINDOW MARKER -- DEVHOST ARGS...

The first ``render_tile`` of window WINDOW (``row_col``) in a process started while the file
MARKER does not exist creates MARKER and never returns: it sleeps in a loop that nothing the
host does can end, as a thread stuck in native code (a GDAL deadlock) would. Every other call,
and every call in a later process, is the app's own. The real function is wrapped before the
app is imported, so the app registers the wrapper.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path


def install(window: str, marker: Path) -> None:
    from activities import tiling

    render_tile = tiling.render_tile

    @functools.wraps(render_tile)  # the app registers the activity under its function's name
    def stuck_once(payload: dict) -> dict:
        place = payload["window"]
        if f"{place['row']:04d}_{place['col']:04d}" == window and not marker.exists():
            marker.write_text("stuck\n")
            while True:
                time.sleep(0.1)
        return render_tile(payload)

    tiling.render_tile = stuck_once


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--")
    window, marker = argv[:split]
    install(window, Path(marker))
    from devhost.cli import main as devhost_main

    return devhost_main(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
