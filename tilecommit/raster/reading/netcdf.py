"""NetCDF and HDF5 uploads: read from a pinned, length-checked local copy, their HDF5 structure
checked before GDAL opens them, one variable of them opened.

**Why a copy.** GDAL's netCDF driver reads through the netCDF library, which opens a path on
disk, not GDAL's virtual files. For a ``/vsi`` path GDAL 3.10 maps the file into memory and
serves its page faults on a thread of its own through userfaultfd (``netCDFDataset::Open`` in
frmts/netcdf/netcdfdataset.cpp, port/cpl_userfaultfd.cpp). Through the upload's reader (a file
system whose calls come to Python, :mod:`.gdal_files`) that thread waits for the GIL the faulting
thread holds: measured here (through rasterio's opener then, which calls Python the same way), an
open of a 300 x 200 netCDF-4 file through it hung for good (the main thread in the kernel's
``handle_userfault``, the other in a futex wait); where userfaultfd is not allowed
(``vm.unprivileged_userfaultfd=0`` without ``CAP_SYS_PTRACE``, as on most hosts) the open fails.
So the upload is copied to the instance's temporary disk, every byte through the same pinned
reader a TIFF is read with (``If-Match`` on the job's ETag on every GET, every short or failed
read a fault, never bad input), its size checked against :data:`MAX_LOCAL_COPY_BYTES`
before the first byte is fetched and the copy's length against the blob's size after the last.

**A copy while it is read.** An open (the validation, a window's render or scrub) makes a copy
in a fresh private directory, opens it, and unlinks it at once: the netCDF and HDF5 libraries
read through the descriptors they opened, and one more is held for the dataset's life
(:func:`open_copy`), so the disk is given back when the last dataset reading it is gone, or when
the process dies (a killed worker leaves nothing behind). An open of the same version (blob name,
ETag, size) while a dataset of this process still reads a copy of it reads that copy instead;
nothing is kept for a later open. Nothing but the copy
is ever in that directory, so no sidecar (``.aux.xml``, ``.ncml``) can be found beside it.

**What a file may name.** NetCDF classic and 64-bit offset files hold a header and the variables'
bytes, nothing that names another file. A netCDF-4 file is HDF5, which can: an external link
(a group member that is an object of another file), a dataset's external storage (its bytes in
other files, ``H5Pset_external``) and a virtual dataset (VDS) whose sources are other files. HDF5
follows them when the object is opened, relative to the process's directory, the file's, or
``HDF5_EXT_PREFIX`` / ``HDF5_VDS_PREFIX``; neither the netCDF library nor GDAL offers a switch
that stops it (HDF5's own, an external-link callback, ``H5Pset_elink_cb``, is not reachable
through them), and no prefix makes an absolute name safe. So the copy's structure is read with
h5py, which lists links without following them (``visititems_links``), before GDAL opens it
(:func:`check_hdf5_structure`), and a file with any of them is refused naming it. So is a dataset
whose filter is not one HDF5 builds in: the library would look for it as a plugin in
``HDF5_PLUGIN_PATH`` (a shared library loaded into the process).

**The variable.** A file with one data variable (GDAL's netCDF driver: a variable of two
dimensions or more that is no coordinate) needs none named; with several, the job's ``variable``
option (``tilecommit_variable`` in the blob's metadata, or a path rule's ``variable=``,
tilecommit/profiles.py) names it, else the file is refused naming them. It is part of the job's
spec, so of its id, and every open of the job opens the same one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
import weakref
from dataclasses import dataclass, field

import rasterio
from rasterio.errors import NotGeoreferencedWarning, RasterioIOError

from ...errors import InvalidRasterError, UnsupportedRasterError
from .upload import NETCDF

#: The largest local copy: each activity that reads the upload makes its own, and host.json lets an
#: instance run 4 activities at once (``maxConcurrentActivityFunctions``), so 4 copies fit the
#: temporary disk an assembly may use (:data:`~.budgets.TEMPORARY_DISK_BYTES`, 400 MB; this
#: module cannot import it: the reader that opens through this module is imported by budgets).
MAX_LOCAL_COPY_BYTES = 100 * 1000 * 1000
#: Most bytes of a classic file's header read to find where its data ends (a header longer than
#: this is refused as truncated: it would name thousands of variables and attributes).
CLASSIC_HEADER_BYTES = 4 * 1024 * 1024
#: The HDF5 signature (a netCDF-4 file's first bytes).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Bytes fetched by one GET of the copy (each pinned and checked as the upload's reader checks one).
COPY_PART = 32 * 1024 * 1024
#: Prefix of a copy's private directory.
COPY_PREFIX = "tilecommit-netcdf-"
#: Most HDF5 objects and links the structure check walks: a file declaring more is refused, not walked.
MAX_HDF5_OBJECTS = 10_000
#: HDF5's own filters (H5Zpublic.h: deflate, shuffle, fletcher32, szip, nbit, scaleoffset): any
#: other is a plugin HDF5 would look for on disk.
BUILTIN_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit", 6: "scaleoffset"}


def local_copy(source) -> str:
    """The path of a fresh copy of ``source`` (a :class:`~.source.Source`, which imports this
    module: not imported here) in its own private directory, every byte read through
    it at its version: a fault is raised as the upload's reader raises it (retried, never bad input)."""
    size = source.file_size
    if size > MAX_LOCAL_COPY_BYTES:
        raise UnsupportedRasterError(
            f"{source.name} is a NetCDF/HDF5 file of {size} bytes: GDAL reads one from a copy on the instance's "
            f"temporary disk, and a copy may take at most {MAX_LOCAL_COPY_BYTES} bytes; accepted: a file of at "
            "most that size (split it by time or by variable), or a GeoTIFF (`gdal_translate -of COG`)"
        )
    directory = tempfile.mkdtemp(prefix=COPY_PREFIX)
    path = os.path.join(directory, "upload.nc")
    try:
        with open(path, "xb") as out, source.checked():
            for offset in range(0, size, COPY_PART):
                out.write(source.fetch(offset, min(COPY_PART, size - offset)))
        copied = os.path.getsize(path)
        if copied != size:  # fetch returns every byte asked for or raises: this is the last word on it
            raise OSError(f"the copy of {source.name} has {copied} bytes, the blob {size}")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return path


def _refusal(name: str, what: str) -> UnsupportedRasterError:
    return UnsupportedRasterError(
        f"{name} is an HDF5/netCDF-4 file that names another file: {what}; an upload must hold its pixels "
        "itself (nothing is read beside it); accepted: a self-contained NetCDF file (e.g. `nccopy -k nc4 in out`, "
        "or `gdal_translate -of netCDF`, on a machine that has the other files)"
    )


def check_hdf5_structure(path: str, name: str) -> None:
    """Refuse an HDF5 file that names other files or needs a filter plugin, reading its structure
    with h5py before GDAL opens it; nothing named is opened (links are listed, not followed)."""
    import h5py

    # h5py's visitors stop at a callback's first value that is not None; an exception raised
    # inside one does not come back through its lock intact (a SystemError), so each returns why.
    seen = 0

    def link(member: str, found) -> Exception | None:
        nonlocal seen
        seen += 1
        if seen > MAX_HDF5_OBJECTS:
            return UnsupportedRasterError(
                f"{name} has more than {MAX_HDF5_OBJECTS} HDF5 objects and links: accepted: at most that many"
            )
        if isinstance(found, h5py.ExternalLink):
            return _refusal(name, f"{member!r} is an external link to {found.path!r} in {found.filename!r}")
        if not isinstance(found, h5py.HardLink | h5py.SoftLink):
            return _refusal(name, f"{member!r} is a user-defined link, which HDF5 resolves by its own rules")
        return None

    def dataset(member: str, found) -> Exception | None:
        if not isinstance(found, h5py.Dataset):
            return None
        if found.is_virtual:
            others = sorted({source.file_name for source in found.virtual_sources() if source.file_name != "."})
            if others:
                return _refusal(name, f"{member!r} is a virtual dataset whose sources are in {', '.join(others)}")
        if found.external:
            files = sorted({str(entry[0]) for entry in found.external})
            return _refusal(name, f"{member!r} keeps its bytes in external storage ({', '.join(files)})")
        plist = found.id.get_create_plist()
        for index in range(plist.get_nfilters()):
            code = plist.get_filter(index)[0]
            if code not in BUILTIN_FILTERS:
                return UnsupportedRasterError(
                    f"{name}: {member!r} is compressed with HDF5 filter {code}, a plugin HDF5 would load from "
                    f"disk; accepted: HDF5's own filters ({', '.join(BUILTIN_FILTERS.values())})"
                )
        return None

    try:
        with h5py.File(path, "r") as file:
            refused = file.visititems_links(link) or file.visititems(dataset)
    except OSError as exc:
        raise InvalidRasterError(f"{name} starts like an HDF5 file but its structure cannot be read: {exc}") from exc
    if refused is not None:
        raise refused


#: Bytes of one value of each classic nc_type (NC_BYTE, NC_CHAR, NC_SHORT, NC_INT, NC_FLOAT, NC_DOUBLE).
CLASSIC_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 4, 6: 8}
#: numrecs of a classic file still being written (the netCDF format spec's STREAMING).
STREAMING = 0xFFFFFFFF


class _Header:
    """A classic or 64-bit offset NetCDF header read field by field (big-endian, 4-byte aligned)."""

    def __init__(self, data: bytes, name: str):
        self.data, self.at, self.name = data, 4, name

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise InvalidRasterError(f"{self.name} is truncated: its NetCDF header ends past the file's end")
        chunk, self.at = self.data[self.at : self.at + size], self.at + size
        return chunk

    def number(self, size: int = 4) -> int:
        return int.from_bytes(self.take(size), "big")

    def skip_name(self) -> None:
        self.take(-(-self.number() // 4) * 4)

    def skip_attributes(self) -> None:
        self.number()  # NC_ATTRIBUTE, or ABSENT's first zero
        for _ in range(self.number()):
            self.skip_name()
            size = CLASSIC_TYPE_SIZES.get(self.number(), 1)
            self.take(-(-(self.number() * size) // 4) * 4)


def classic_data_end(data: bytes, name: str) -> int:
    """The byte at which a classic (``CDF\x01``) or 64-bit offset (``CDF\x02``) file's data ends,
    as its header declares it (the netCDF classic format specification: each variable's ``begin``
    and ``vsize``, records ``numrecs`` times the sum of the record variables' sizes). The netCDF
    library reads the bytes of a file cut short as if they were unwritten (fill values), so a
    truncated upload would make tiles of made-up pixels: its length is checked against this."""
    header = _Header(data, name)
    offset_size = 8 if data[3] == 2 else 4
    records = header.number()
    lengths = []
    header.number()  # NC_DIMENSION, or ABSENT's first zero
    for _ in range(header.number()):
        header.skip_name()
        lengths.append(header.number())
    header.skip_attributes()
    header.number()  # NC_VARIABLE, or ABSENT's first zero
    fixed_end, record_vars = 0, []
    for _ in range(header.number()):
        header.skip_name()
        dims = [header.number() for _ in range(header.number())]
        header.skip_attributes()
        header.number()  # nc_type
        vsize, begin = header.number(), header.number(offset_size)
        if dims and dims[0] < len(lengths) and lengths[dims[0]] == 0:
            record_vars.append((begin, vsize))
        else:
            fixed_end = max(fixed_end, begin + vsize)
    if not record_vars or records in (0, STREAMING):
        return fixed_end
    record_size = sum(vsize for _, vsize in record_vars)
    return max(fixed_end, *(begin + (records - 1) * record_size + vsize for begin, vsize in record_vars))


def check_classic_length(path: str, name: str, size: int) -> None:
    """Refuse a classic or 64-bit offset file shorter than its header says (:func:`classic_data_end`)."""
    with open(path, "rb") as file:
        head = file.read(CLASSIC_HEADER_BYTES)
    end = classic_data_end(head, name)
    if end > size:
        raise InvalidRasterError(
            f"{name} is truncated: its NetCDF header declares data up to byte {end}, the file has {size} bytes; "
            "upload the complete file"
        )


def variables_of(dataset) -> list[str]:
    """The data variables GDAL's netCDF driver offers in the file it opened whole: its
    subdatasets (``NETCDF:"file":name``), or the one variable it opened as bands."""
    listed = dataset.tags(ns="SUBDATASETS")  # SUBDATASET_<n>_NAME=NETCDF:"file":name (rasterio's list drops the quotes)
    names = [value.rpartition('":')[2] for key, value in sorted(listed.items()) if key.endswith("_NAME")]
    if not names and dataset.count:
        name = dataset.tags(1).get("NETCDF_VARNAME")
        names = [name] if name else []
    return names


def _chosen(name: str, variables: list[str], variable: str | None) -> str:
    listed = ", ".join(variables)
    if variable is not None and variable not in variables:
        raise UnsupportedRasterError(
            f"{name} has no data variable {variable!r} (the job's variable option): it holds {listed or 'none'}"
        )
    if variable is not None:
        return variable
    if not variables:
        raise UnsupportedRasterError(
            f"{name} holds no data variable of two dimensions or more on a grid: nothing to tile; accepted: a "
            "CF variable on a grid (x, y, perhaps time or level)"
        )
    if len(variables) > 1:
        raise UnsupportedRasterError(
            f"{name} holds several data variables ({listed}) and the job names none: set the blob metadata "
            "tilecommit_variable (or a TILECOMMIT_PROFILE_RULES rule's variable=) to one of them"
        )
    return variables[0]


@dataclass
class _Live:
    """The descriptor held on one live copy, how many datasets read it (all of them by its one
    ``/proc/self/fd/<n>`` name), and those datasets (GDAL may have closed one its object outlives)."""

    held: int
    readers: int = 1
    datasets: weakref.WeakSet = field(default_factory=weakref.WeakSet)

    def open(self) -> bool:
        return any(not dataset.closed for dataset in self.datasets)


#: This process's live copies, by upload version (blob name, ETag, size).
_LIVE: dict[tuple[str, str, int], _Live] = {}
_LIVE_LOCK = threading.Lock()


def _version_of(source) -> tuple[str, str, int] | None:
    """What a copy of ``source`` is a copy of: a pinned blob's name, ETag and size (None for a
    local file, which is read where it is by each open)."""
    etag = getattr(source, "etag", None)
    return None if etag is None else (source.name, etag, source.file_size)


def _shared(version: tuple[str, str, int] | None) -> int | None:
    """The descriptor on a copy of ``version`` a dataset still holds open, now read by one more
    dataset; None: none."""
    with _LIVE_LOCK:
        live = _LIVE.get(version) if version is not None else None
        if live is None or not live.open():
            return None
        live.readers += 1
        return live.held


def _hold(version: tuple[str, str, int] | None, held: int, dataset) -> bool:
    """Make ``held`` (read by ``dataset``) the live copy of ``version`` unless one is live already
    (another open made one meanwhile, or a local file: then ``held`` is its dataset's alone)."""
    with _LIVE_LOCK:
        if version is None or version in _LIVE:
            return False
        _LIVE[version] = _Live(held)
        _LIVE[version].datasets.add(dataset)
        return True


def _read_by(version: tuple[str, str, int] | None, dataset) -> None:
    with _LIVE_LOCK:
        live = _LIVE.get(version) if version is not None else None
        if live is not None:
            live.datasets.add(dataset)


def _release(version: tuple[str, str, int] | None, held: int) -> None:
    """One dataset fewer reads the copy ``held``; the last closes it (and the disk is given back)."""
    with _LIVE_LOCK:
        live = _LIVE.get(version) if version is not None else None
        if live is not None and live.held == held:
            live.readers -= 1
            if live.readers:
                return
            del _LIVE[version]  # type: ignore[arg-type]  # live is None when version is
    os.close(held)


def _open_held(held: int, name: str, variable: str | None, options: dict) -> rasterio.DatasetReader:
    """The variable of the copy ``held`` is a descriptor on, opened by its ``/proc/self/fd`` name."""
    path = f"/proc/self/fd/{held}"
    with warnings.catch_warnings():
        # Opened whole, a file of several variables has no bands and no georeferencing: only its list.
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with rasterio.open(path, driver=NETCDF.driver, **options) as whole:
            chosen = _chosen(name, variables_of(whole), variable)
    return rasterio.open(f'NETCDF:"{path}":{chosen}', driver=NETCDF.driver, **options)


def _open_fresh(source, variable: str | None, options: dict) -> tuple[rasterio.DatasetReader, int]:
    """The variable opened from a new, checked copy of ``source``, whose path is gone once it is open
    (HDF5 opens a file by name only while its path exists, or while it holds it open already)."""
    path = local_copy(source)
    held = None
    try:
        with source.checked():
            head = source.read_at(0, len(HDF5_SIGNATURE))
        if head == HDF5_SIGNATURE:
            check_hdf5_structure(path, source.name)
        else:
            check_classic_length(path, source.name, source.file_size)
        held = os.open(path, os.O_RDONLY)
        return _open_held(held, source.name, variable, options), held
    except BaseException:
        if held is not None:
            os.close(held)
        raise
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def open_copy(source, variable: str | None, **open_options) -> rasterio.DatasetReader:
    """``variable`` of the upload (its only data variable when None), opened by GDAL's netCDF
    driver from a local copy whose path is gone as soon as it is open (the module's notes).

    The dataset is opened by the name ``/proc/self/fd/<n>`` of a descriptor held on the copy for
    as long as the dataset lives: a warped job's VRT opens its source again by name
    (:func:`~.warp.warped`) while the dataset holds it open. While one lives, another open of the
    same version in this process (a window rendered beside it) reads the same copy by the same name
    (the descriptor closed with the last of them) instead of downloading it again. HDF5 opens a
    file whose path is gone by that name only while it holds the file open (it resolves the link
    to the deleted path otherwise): should the copy's last dataset close in between, the open
    makes a copy of its own."""
    options = {**NETCDF.open_options, **open_options}
    version = _version_of(source)
    held = _shared(version)
    if held is not None:
        try:
            dataset = _open_held(held, source.name, variable, options)
        except RasterioIOError:
            _release(version, held)
        except BaseException:
            _release(version, held)
            raise
        else:
            _read_by(version, dataset)
            weakref.finalize(dataset, _release, version, held)
            return dataset
    dataset, held = _open_fresh(source, variable, options)
    if _hold(version, held, dataset):
        weakref.finalize(dataset, _release, version, held)
    else:
        weakref.finalize(dataset, os.close, held)
    return dataset
