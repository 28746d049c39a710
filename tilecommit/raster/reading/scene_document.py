"""A scene document's members stacked into one dataset: a VRT of our own making over the members,
each read through its own pinned reader.

The document (:mod:`tilecommit.scene_documents`: its forms and what a member may be) is read
through the upload's reader, size-bounded, and parsed; every member is a :class:`~.source.Source`
of its own: a :class:`~.source.PinnedBlob` at the ETag the job was started with
(:func:`pin_members`), or, for a local document, a :class:`~.source.LocalFile` beside it. The
members are the document source's :attr:`~.source.Source.members`, so a check of the document's
GDAL calls (:meth:`~.source.Source.checked`) is a check of every member's reads.

The stack is what ``gdalbuildvrt -separate -resolution highest -r <kernel>`` makes of the same
files: one band per member in the document's order, on the union of their extents at the finest
member resolution, each coarser member resampled by the document's kernel (GDAL's VRT source
``resampling``), written here as XML naming each member by the path GDAL reads it through (its
path in the app's file system, :func:`~.gdal_files.gdal_path`), with the member's format's open
options; the document's XML, if it were any, is never opened. Members must share one CRS and nest in the finest grid (every resolution an integer
multiple of the finest, every origin on the finest grid), have one band each, one sample type and
one nodata value (or none) between them; refused with the reason otherwise.
"""

from __future__ import annotations

import math
import os
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from functools import partial
from typing import Any

import rasterio
from affine import Affine
from rasterio.dtypes import _gdal_typename
from rasterio.windows import Window as RioWindow

from ...errors import InvalidRasterError, SourceChangedError, UnsupportedRasterError
from ...jobs import SceneMember
from ...scene_documents import MAX_DOCUMENT_BYTES, SceneDocument, parse_document
from ...spec import OutputSpec
from .source import (
    LocalFile,
    PinnedBlob,
    Source,
    open_upload,
    prefetch_window,
    prefetches_by,
    reads_through,
    upload_format_of,
)
from .upload import SCENE_DOCUMENT, UploadFormat

#: How far a member's resolution ratio or origin offset may be from a whole number of finest
#: pixels and still nest (floating-point noise of geotransforms written by other software).
NEST_TOLERANCE = 1e-6
#: Edge of the stack's blocks (the VRT's): a window (a multiple of 256) is whole blocks.
STACK_BLOCK = 256

#: The job's members of a pinned document (:func:`pin_members`), the missing ones included.
_JOB_MEMBERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pin_members(document: Source, members: Sequence[SceneMember], blob_client: Callable[[str], object]) -> None:
    """Make ``document`` (the job's upload) read its ``members`` at the ETags the job was started
    with: a :class:`~.source.PinnedBlob` each (``blob_client(name)`` gives its client)."""
    _JOB_MEMBERS[document] = tuple(members)
    document.members = tuple(PinnedBlob(blob_client(m.blob), m.etag) for m in members if m.etag)


def member_spec(spec: OutputSpec) -> OutputSpec:
    """What a member is checked with as an upload: the job's windows, the default profile (the
    profile's own checks are the stack's)."""
    return OutputSpec(window_size=spec.window_size, block_size=spec.block_size)


def read_document(source: Source) -> SceneDocument:
    """The document ``source`` parsed: its size checked before a byte of it is read."""
    name = source.blob.blob_name if isinstance(source, PinnedBlob) else os.path.basename(source.name)
    size = source.file_size
    if size > MAX_DOCUMENT_BYTES:
        parse_document(name, b"", size)  # refuses it, saying why
    with source.checked():
        body = source.read_at(0, size)
    return parse_document(name, body, size)


def member_sources(source: Source, document: SceneDocument) -> tuple[Source, ...]:
    """Every member's :class:`~.source.Source`, in the document's order; refused when one was
    missing when the job started (the job fails once, naming them)."""
    listed = _JOB_MEMBERS.get(source)
    names = [band.blob for band in document.bands]
    if listed is not None:
        if [m.blob for m in listed] != names:
            raise SourceChangedError(f"{source.name} names other members than the job was started with")
        missing = [m.blob for m in listed if not m.etag]
        if missing:
            raise InvalidRasterError(
                f"the scene document {source.name} names {len(missing)} member(s) that did not exist when its job "
                f"started: {', '.join(missing)}; upload them, then upload the document again (its new version starts "
                "a new job)"
            )
        return source.members
    if isinstance(source, LocalFile):
        folder = os.path.dirname(source.name)
        if not source.members:
            source.members = tuple(LocalFile(os.path.join(folder, name)) for name in names)
        return source.members
    raise InvalidRasterError(
        f"{source.name} is a scene document but its job carries no members; upload the document again"
    )


def member_format(member: Source) -> UploadFormat:
    """A member's accepted format, a raster's (a member is never itself a document)."""
    fmt = upload_format_of(member)
    if fmt is SCENE_DOCUMENT:
        raise UnsupportedRasterError(f"member {member.name} is itself a scene document: members are band files")
    return fmt


def open_any_upload(
    source: Source, *, upload_format: UploadFormat | None = None, variable: str | None = None
) -> rasterio.DatasetReader:
    """An upload opened as :func:`~.source.open_upload` opens it (a NetCDF's ``variable``), or, for
    a scene document, its stack (:func:`open_scene`), read through the document's source and its
    members'. A document has no variables: one named is refused as :func:`~.source.open_upload`
    refuses it for a TIFF."""
    fmt = upload_format if upload_format is not None else upload_format_of(source)
    if fmt is not SCENE_DOCUMENT or variable is not None:
        return open_upload(source, upload_format=fmt, variable=variable)
    dataset = open_scene(source)
    reads_through(dataset, source)
    return dataset


def open_scene(source: Source) -> rasterio.DatasetReader:
    """The stack of the document ``source``: a dataset GDAL reads through every member's reader;
    the members stay open while it is (they close with it)."""
    document = read_document(source)
    members = member_sources(source, document)
    stack = ExitStack()
    try:
        opened = []
        for member in members:
            fmt = member_format(member)
            opened.append((stack.enter_context(open_upload(member, upload_format=fmt)), fmt))
        check_stack(source.name, document, [dataset for dataset, _ in opened])
        xml = stack_xml(document, opened)
        with source.checked():
            dataset = rasterio.open(xml)
    except BaseException:
        stack.close()
        raise
    dataset._env.push(stack)  # rasterio closes a dataset's _env (an ExitStack) after the dataset
    prefetches_by(dataset, partial(_prefetch_members, dataset.transform, [d for d, _ in opened]))
    return dataset


def _prefetch_members(stack: Affine, members: Sequence, window) -> None:
    """Fetch ahead each member's blocks under ``window`` of the stack (whose grid is ``stack``),
    a pixel more around for the kernel's reach, one merged request per run of blocks."""
    left, top = stack * (window.col_off, window.row_off)
    right, bottom = stack * (window.col_off + window.width, window.row_off + window.height)
    for member in members:
        cols, rows = zip(*(~member.transform * corner for corner in ((left, top), (right, bottom))), strict=True)
        col0, row0 = max(0, math.floor(min(cols)) - 1), max(0, math.floor(min(rows)) - 1)
        col1, row1 = min(member.width, math.ceil(max(cols)) + 1), min(member.height, math.ceil(max(rows)) + 1)
        if col1 > col0 and row1 > row0:
            prefetch_window(member, RioWindow(col0, row0, col1 - col0, row1 - row0))


def _nests(value: float) -> bool:
    return abs(value - round(value)) <= NEST_TOLERANCE


def check_stack(path: str, document: SceneDocument, datasets: Sequence) -> None:
    """Refuse members that do not stack: another CRS, a grid that does not nest, more than one
    band, another sample type or nodata value."""
    names = [band.blob for band in document.bands]
    first, first_name = datasets[0], names[0]
    for name, dataset in zip(names, datasets, strict=True):
        what = f"{path}: member {name}"
        if dataset.count != 1:
            raise UnsupportedRasterError(f"{what} has {dataset.count} bands; accepted: band files of one band each")
        if dataset.crs != first.crs:
            raise UnsupportedRasterError(
                f"{what} is on another CRS than {first_name} ({dataset.crs} vs {first.crs}); accepted: members on one "
                "CRS (warp them to one first)"
            )
        if dataset.dtypes[0] != first.dtypes[0] or dataset.nodata != first.nodata:
            raise UnsupportedRasterError(
                f"{what} has sample type {dataset.dtypes[0]} and nodata {dataset.nodata}, {first_name} "
                f"{first.dtypes[0]} and {first.nodata}; accepted: one sample type and one nodata value for all"
            )
        if dataset.transform.b or dataset.transform.d:
            raise UnsupportedRasterError(f"{what} is rotated or sheared; accepted: north-up members")
    xres = min(abs(d.transform.a) for d in datasets)
    yres = min(abs(d.transform.e) for d in datasets)
    finest = next(d for d in datasets if abs(d.transform.a) == xres)
    for name, dataset in zip(names, datasets, strict=True):
        ratios = abs(dataset.transform.a) / xres, abs(dataset.transform.e) / yres
        offsets = (dataset.transform.c - finest.transform.c) / xres, (dataset.transform.f - finest.transform.f) / yres
        if not all(map(_nests, ratios)):
            raise UnsupportedRasterError(
                f"{path}: member {name}'s pixels ({abs(dataset.transform.a):g} x {abs(dataset.transform.e):g}) are "
                f"not a whole multiple of the finest member's ({xres:g} x {yres:g}); accepted: resolutions that nest"
            )
        if not all(map(_nests, offsets)):
            raise UnsupportedRasterError(
                f"{path}: member {name}'s origin ({dataset.transform.c:g}, {dataset.transform.f:g}) is not on the "
                f"finest member's grid ({offsets[0]:g}, {offsets[1]:g} pixels off); accepted: origins aligned to it"
            )


def stack_xml(document: SceneDocument, opened: Sequence[tuple[Any, UploadFormat]]) -> str:
    """The VRT ``gdalbuildvrt -separate -resolution highest -r <kernel>`` writes for the members
    (each by the path GDAL reads it through), with the document's band names as the bands' descriptions."""
    datasets = [dataset for dataset, _ in opened]
    xres = min(abs(d.transform.a) for d in datasets)
    yres = min(abs(d.transform.e) for d in datasets)
    west = min(d.bounds.left for d in datasets)
    north = max(d.bounds.top for d in datasets)
    width = int(0.5 + (max(d.bounds.right for d in datasets) - west) / xres)
    height = int(0.5 + (north - min(d.bounds.bottom for d in datasets)) / yres)
    first = datasets[0]
    root = ET.Element("VRTDataset", rasterXSize=str(width), rasterYSize=str(height))
    ET.SubElement(root, "SRS").text = first.crs.to_wkt()
    ET.SubElement(root, "GeoTransform").text = ",".join(repr(float(v)) for v in (west, xres, 0, north, 0, -yres))
    dtype = _gdal_typename(first.dtypes[0])
    for index, ((dataset, fmt), band) in enumerate(zip(opened, document.bands, strict=True), start=1):
        element = ET.SubElement(
            root,
            "VRTRasterBand",
            dataType=dtype,
            band=str(index),
            blockXSize=str(STACK_BLOCK),
            blockYSize=str(STACK_BLOCK),
        )
        ET.SubElement(element, "Description").text = band.name
        # A COG of gdalbuildvrt's stack (which names no colours) has its first band grey, the rest
        # undefined, as GTiff reads a "minisblack" file; the stack says so itself, as its tiles will.
        ET.SubElement(element, "ColorInterp").text = "Gray" if index == 1 else "Undefined"
        if dataset.nodata is not None:
            ET.SubElement(element, "NoDataValue").text = repr(float(dataset.nodata))
        kind = "ComplexSource" if dataset.nodata is not None else "SimpleSource"
        source = ET.SubElement(element, kind, resampling=document.resampling)
        # Not shared: a member opened for this stack closes with it, while its reader is registered
        # (a shared one stays in GDAL's dataset pool after the stack and is closed later, by then unregistered).
        ET.SubElement(source, "SourceFilename", relativeToVRT="0").text = dataset.name
        if fmt.open_options:
            options = ET.SubElement(source, "OpenOptions")
            for key, value in fmt.open_options.items():
                ET.SubElement(options, "OOI", key=key).text = str(value)
        ET.SubElement(source, "SourceBand").text = "1"
        t = dataset.transform
        ET.SubElement(source, "SrcRect", xOff="0", yOff="0", xSize=str(dataset.width), ySize=str(dataset.height))
        ET.SubElement(
            source,
            "DstRect",
            xOff=str(round((t.c - west) / xres)),
            yOff=str(round((north - t.f) / yres)),
            xSize=str(round(dataset.width * abs(t.a) / xres)),
            ySize=str(round(dataset.height * abs(t.e) / yres)),
        )
        if dataset.nodata is not None:
            ET.SubElement(source, "NODATA").text = repr(float(dataset.nodata))
    return ET.tostring(root, encoding="unicode")
