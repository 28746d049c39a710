"""The app's GDAL file system (tilecommit/raster/reading/gdal_files.py): GDAL's table of file
systems is changed once per process, never by a read, so no GDAL call walking it can meet a
change (the crash it replaces: a worker's SIGSEGV in rasterio.open of a MEM dataset while another
thread closed an upload opened through rasterio's ``opener``, which removes its prefix).

A walk of GDAL's map meeting a removal is a race of nanoseconds; it is not made to happen here.
What is shown is the construction: the prefixes GDAL holds, sampled without pause from another
thread while several threads open and read uploads, never change, where rasterio's ``opener``
changes them at every open and close (the control, seen by the same sampler).
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys
import threading

import numpy as np
import pytest
import rasterio
from rasterio.windows import Window

from testkit.scenes import SceneSpec, write_scene
from tilecommit.raster.reading import gdal_files
from tilecommit.raster.reading.gdal_files import PREFIX, STAT_LAYOUTS, file_system_prefixes, gdal_path, loaded_libgdal
from tilecommit.raster.reading.source import LocalFile, open_upload

GDAL = loaded_libgdal()
THREADS = 4
OPENS_PER_THREAD = 20


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    path = tmp_path_factory.mktemp("gdal-files") / "scene.tif"
    write_scene(path, SceneSpec(width=640, height=512, blocksize=256))
    with rasterio.open(path) as plain:
        return path, plain.read()


class PrefixSampler:
    """Reads GDAL's list of prefixes over and over on a thread of its own, keeping every distinct list."""

    def __init__(self):
        self.seen: set[tuple[str, ...]] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.seen.add(tuple(sorted(file_system_prefixes(GDAL))))
            self.samples += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)


def read_in_threads(scene_path, expected, open_dataset) -> list[BaseException]:
    """``THREADS`` threads each open the scene ``OPENS_PER_THREAD`` times and read a window; errors kept."""
    errors: list[BaseException] = []

    def work(index: int):
        try:
            for _ in range(OPENS_PER_THREAD):
                with open_dataset(scene_path) as dataset:
                    window = Window(128 * index, 64, 256, 256)
                    got = dataset.read(window=window)
                assert np.array_equal(got, expected[:, 64:320, 128 * index : 128 * index + 256])
        except BaseException as exc:  # kept for the assertion in the test's own thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return errors


def test_reads_from_several_threads_leave_gdals_file_systems_as_they_were(scene):
    path, expected = scene
    before = tuple(sorted(file_system_prefixes(GDAL)))
    assert PREFIX in before
    with PrefixSampler() as sampler:
        errors = read_in_threads(path, expected, lambda p: open_upload(LocalFile(p)))
    assert errors == []
    assert sampler.samples > 10
    assert sampler.seen == {before}
    assert tuple(sorted(file_system_prefixes(GDAL))) == before


def test_the_control_rasterios_opener_changes_them_at_every_open_and_close(scene):
    """What the sampler sees of rasterio's bridge, which the app no longer uses."""
    path, expected = scene
    before = tuple(sorted(file_system_prefixes(GDAL)))

    def through_rasterios_opener(p):
        source = LocalFile(p)
        return rasterio.open(source.path, driver="GTiff", opener=source)

    with PrefixSampler() as sampler:
        errors = read_in_threads(path, expected, through_rasterios_opener)
    assert errors == []
    changed = sampler.seen - {before}
    assert changed, f"{sampler.samples} samples saw only the prefixes before"
    assert all(any(p.startswith("/vsiriopener_") for p in set(seen) - set(before)) for seen in changed)
    assert tuple(sorted(file_system_prefixes(GDAL))) == before


def test_a_dataset_opened_on_one_thread_is_read_on_another(scene):
    """rasterio's registry lived in context variables, so an opener's file could only be read in
    the context it was opened in; the app's is one per process."""
    path, expected = scene
    dataset = open_upload(LocalFile(path))
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.append(dataset.read(window=Window(0, 0, 256, 256))))
    reader.start()
    reader.join(timeout=60)
    dataset.close()
    assert len(got) == 1 and np.array_equal(got[0], expected[:, :256, :256])


def test_a_source_is_found_while_something_holds_it_and_not_after(scene):
    path, _ = scene
    source = LocalFile(path)
    name = gdal_path(source)
    assert name.startswith(PREFIX) and gdal_path(source) == name  # one path per source
    with rasterio.open(name, driver="GTiff") as dataset:
        assert dataset.shape == (512, 640)
    del source
    gc.collect()
    with pytest.raises(rasterio.errors.RasterioIOError, match="No such file or directory"):
        rasterio.open(name, driver="GTiff")


def test_only_the_sources_own_file_exists_there(scene):
    """No listing and no companion: GDAL looks for ``.aux.xml``, ``.ovr`` and ``.msk`` beside an
    upload and finds none, nor any other name under the source's token."""
    path, _ = scene
    source = LocalFile(path)
    name = gdal_path(source)
    GDAL.VSIStatL.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    GDAL.VSIReadDir.restype = ctypes.c_void_p
    GDAL.VSIReadDir.argtypes = [ctypes.c_char_p]
    buffer = ctypes.create_string_buffer(512)
    assert GDAL.VSIStatL(name.encode(), buffer) == 0
    for companion in (".aux.xml", ".ovr", ".msk"):
        assert GDAL.VSIStatL((name + companion).encode(), buffer) == -1
    assert GDAL.VSIStatL(name.rsplit("/", 1)[0].encode() + b"/other.tif", buffer) == -1
    assert GDAL.VSIReadDir(os.path.dirname(name).encode()) is None
    assert source.requests == 0  # a stat answers from the size, known since the source was made


def test_the_stat_layout_is_the_platforms(scene):
    """The offsets the plugin writes a file's size and mode at are where this machine's C library
    puts them: libc's own stat of the scene, read at those offsets, gives its size and a regular file."""
    path, _ = scene
    layout = STAT_LAYOUTS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(layout["size"] + 64)
    assert libc.stat(os.fsencode(path), buffer) == 0, os.strerror(ctypes.get_errno())
    size_at, size_type = layout["st_size"]
    mode_at, mode_type = layout["st_mode"]
    assert size_type.from_buffer(buffer, size_at).value == os.path.getsize(path)
    assert mode_type.from_buffer(buffer, mode_at).value == os.stat(path).st_mode


def test_importing_it_again_is_refused_rather_than_leave_gdal_calling_the_first_copy():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gdal_files_again", gdal_files.__file__)
    again = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = again  # as an import does, for its dataclass
    try:
        with pytest.raises(RuntimeError, match="imported once per process"):
            spec.loader.exec_module(again)
    finally:
        del sys.modules[spec.name]
