"""Watching which threads GDAL reads an upload on, and running GDAL work at once with a bounded wait.

GDAL reads an upload through the app's file system: a plugin whose every call
(tilecommit/raster/reading/gdal_files.py: its stat, seek and read) takes the GIL and
calls the app's reader (tilecommit/raster/reading/source.py). A call made on one of GDAL's own
threads is how the process deadlocks (``source.UPLOAD_READ_THREADS`` says why), so the tests
watch for them here, apart from the reader's own refusal of them:

- :class:`GdalThreadReads` wraps the plugin's ``read``, ``seek`` and ``size`` (calling the real
  ones) and records every call made on a thread Python did not start;
- :func:`render_every_window` reads and encodes every window of an upload's grid, as the job's
  renders do, for each read path (:data:`WARPED`: the warped ones);
- :func:`run_at_once` runs tasks in threads of their own and, watching them from the calling
  thread, waits a bounded time; a task still running then fails the test with the stack of every
  thread (written by ``faulthandler``). A
  deadlock in which a thread holds the GIL stops every Python thread, the waiting one too, so
  the concurrent test runs its tasks in a process of its own (:mod:`tests.concurrent_warps`),
  with ``faulthandler`` set to dump every stack and exit once the bound has passed.
"""

from __future__ import annotations

import faulthandler
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tilecommit import profiles
from tilecommit.grid import plan_windows
from tilecommit.raster import inspect_source
from tilecommit.raster.reading.source import LocalFile, Source, SourceFile
from tilecommit.raster.tiling.encode import encode_tile
from tilecommit.raster.tiling.render import window_of_upload
from tilecommit.settings import Settings
from tilecommit.spec import OutputSpec

#: The warped read paths: profile options, and whether their upload is the alpha-band scene.
WARPED = {
    "web-optimized": ({"web_optimized": "true", "warp_resampling": "average"}, False),
    "target_srs and resolution": ({"target_srs": "EPSG:4326", "resolution": "0.0001"}, False),
    "alpha band made the mask": ({"add_mask": "true"}, True),
    "web-optimized alpha band": ({"web_optimized": "true"}, True),
}
#: Windows of two blocks a side: a warped window's read then spans several of the upload's blocks,
#: which is when GTiff decodes with GDAL's pool, if let.
WINDOW = 512


def on_gdal_thread() -> bool:
    """Whether the caller is a thread Python did not start: Python names its current thread a
    ``_DummyThread`` (``threading.current_thread``)."""
    return isinstance(threading.current_thread(), threading._DummyThread)


@dataclass
class GdalThreadReads:
    """Every call of the upload plugin made on a thread Python did not start: (call, file name, thread id)."""

    calls: list[tuple[str, str, int]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, setattr_: Callable[[Any, str, Any], None]) -> GdalThreadReads:
        """Wrap the plugin's calls, with ``setattr_`` (pytest's ``monkeypatch.setattr``, or :func:`setattr`)."""
        for cls, name, file_of in (
            (SourceFile, "read", lambda f: f._source.name),
            (SourceFile, "seek", lambda f: f._source.name),
            (Source, "size", lambda s: s.name),
        ):
            setattr_(cls, name, self._watched(getattr(cls, name), name, file_of))
        return self

    def _watched(self, call: Callable, name: str, file_of: Callable[[Any], str]) -> Callable:
        def watched(obj, *args, **kwargs):
            if on_gdal_thread():
                with self._lock:
                    self.calls.append((name, file_of(obj), threading.get_ident()))
            return call(obj, *args, **kwargs)

        return watched

    def summary(self) -> str:
        names = sorted({(call, name) for call, name, _ in self.calls})
        threads = {thread for *_, thread in self.calls}
        return f"{len(self.calls)} calls on {len(threads)} GDAL threads: {names[:6]}"


def render_every_window(upload: str, options: dict[str, str], settings: Settings) -> int:
    """Validate ``upload`` and read and encode every window of its job's grid (profile ``default``
    with ``options``, windows of :data:`WINDOW`), as render_tile does without the commit; how many."""
    spec = OutputSpec.with_choice(WINDOW, profiles.choose("default", options, where="a test"))
    scene = inspect_source(LocalFile(upload), settings=settings, spec=spec)
    windows = plan_windows(scene.width, scene.height, spec.window_size)
    for window in windows:
        with window_of_upload(LocalFile(upload), window, settings=settings, purpose="render", spec=spec) as src:
            body, _ = encode_tile(src, window, spec=spec)
            assert body
    return len(windows)


def all_stacks() -> str:
    """The stack of every thread of the process, with the threads' names by id.

    Written by faulthandler, which reads each thread's frames as the interpreter keeps them. Walking
    the frame objects of ``sys._current_frames()`` with ``traceback`` instead crashed CPython 3.11
    with a segmentation fault in ``walk_stack`` when other tests' server threads were alive (seen
    running this file after tests/test_uploads.py)."""
    names = "".join(f"thread {thread.ident:#018x} is {thread.name}\n" for thread in threading.enumerate())
    with tempfile.TemporaryFile("w+") as out:
        faulthandler.dump_traceback(out, all_threads=True)
        out.seek(0)
        return names + out.read()


def run_at_once(tasks: dict[str, Callable[[], Any]], bound: float) -> dict[str, Any]:
    """Run every task in a thread of its own, all at once; their results (or the exception each
    raised) by name. A task not done after ``bound`` seconds fails with every thread's stack."""
    results: dict[str, Any] = {}

    def run(name: str, task: Callable[[], Any]) -> None:
        try:
            results[name] = task()
        except BaseException as exc:  # noqa: BLE001 - reported by name to the test
            results[name] = exc

    threads = [threading.Thread(target=run, args=item, name=item[0], daemon=True) for item in tasks.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + bound
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [thread.name for thread in threads if thread.is_alive()]
    assert not stuck, f"{stuck} still running after {bound:.0f} s; every thread's stack:\n{all_stacks()}"
    return results
