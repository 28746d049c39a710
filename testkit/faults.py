"""Fault injection for the crash-and-resume tests: a real process kill at an exact point.

Test-only (the CLI option is hidden). ``crash_before_manifest_entry(n)`` kills this process
with SIGKILL when the n-th manifest row is about to be written: its tile is already committed,
its row is not, which is the window a crash can leave behind.
"""

from __future__ import annotations

import os
import signal
import threading

from tilecommit import manifest


def crash_before_manifest_entry(n: int) -> None:
    original = manifest.record_manifest_entry
    lock = threading.Lock()
    calls = 0

    def record_manifest_entry(*args, **kwargs):
        nonlocal calls
        with lock:
            calls += 1
            if calls >= n:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    manifest.record_manifest_entry = record_manifest_entry
