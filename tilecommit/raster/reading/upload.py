"""What an upload may be (a self-contained TIFF, a JPEG 2000 in a JP2 file, a NetCDF/HDF5 file, a
scene document), recognised by its first bytes, opened by its format's driver alone.

An upload is data from outside the app. Several formats GDAL reads name other files or URLs
inside them, and GDAL follows those names when it opens the file: a VRT's sources (any path,
``/vsicurl/`` URL or ``/vsiaz/`` blob), an ERDAS Imagine file's ``.ige`` spill file, a GDAL_WMS
or STAC description's URLs, a PDS or ISIS label's data file. Opened as they come, an upload could
make the app send requests to any address its instance reaches (internal ones included) or copy
a file of the instance's disk, or another container's blob, into a tile anyone with access to the
outputs can read. A TIFF names nothing outside itself, so the TIFF family (GeoTIFF, COG, BigTIFF)
is accepted, decided from the content, never from the name, and opened by the GTiff driver alone;
a JP2's boxes can name a CRS, a feature collection or a schema by URL, which GDAL, reading it as a
raster with its own boxes as the only georeferencing, never follows (:data:`JPEG2000`). A NetCDF
file can name nothing either; a netCDF-4 (HDF5) file can, and is accepted only once its structure
shows it does not (:mod:`.netcdf`). What GDAL could still reach beside the file (sidecars, the network, PROJ grids) is closed
by :func:`upload_gdal_options`, by the reader that serves GDAL the upload's bytes
(:mod:`.source`) and by :func:`tilecommit.raster.env.gdal_config`. See
docs/uploads.md for the whole list and the tests that show each.

A scene document (:data:`SCENE_DOCUMENT`, a JSON object) is accepted too: it is never given to
GDAL; the band files it names beside it, each a TIFF checked as an upload is, are stacked by a VRT
the app writes itself (:mod:`.scene_document`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...errors import InvalidRasterError, UnsupportedRasterError
from ...scene_documents import looks_like_document

#: How many leading bytes decide what a file is (enough for every signature below).
HEADER_BYTES = 64


@dataclass(frozen=True)
class UploadFormat:
    """A format uploads are accepted in: the first bytes that recognise it, and how GDAL opens it.

    ``open_options`` are given to every dataset GDAL opens on an upload of this format (rasterio's
    open, and a warped VRT's open of its source by name): each format's options that keep GDAL to
    the file's own bytes, and its decoding on the calling thread (see
    :data:`tilecommit.raster.reading.source.UPLOAD_READ_THREADS`).
    """

    name: str
    signatures: tuple[bytes, ...]
    driver: str
    open_options: Mapping[str, str | int] = field(default_factory=dict)
    #: What the format is, in the words of a refusal's "accepted:" list.
    described: str = ""
    #: GDAL configuration while an upload of this format is open (:func:`upload_gdal_options`).
    gdal_config: Mapping[str, str | int] = field(default_factory=dict)
    #: Whether its driver reads a pinned, length-checked local copy (:mod:`.netcdf`) instead of
    #: the upload's reader (:mod:`.source`), which it cannot read through.
    local_copy: bool = False

    def recognises(self, head: bytes) -> bool:
        return any(head.startswith(signature) for signature in self.signatures)


#: Byte-order mark and version of a classic TIFF ("*" = 42) and a BigTIFF ("+" = 43).
TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")

#: The TIFF family, opened by GTiff alone (COG is a layout of GeoTIFF, read by GTiff too).
#: GEOREF_SOURCES=INTERNAL: georeferencing from the file's own tags only, never from a .aux.xml,
#: world file (.tfw/.wld), MapInfo .tab or .xml beside it. NUM_THREADS=1: see
#: :data:`~tilecommit.raster.reading.source.UPLOAD_READ_THREADS`.
TIFF = UploadFormat(
    name="GeoTIFF",
    signatures=TIFF_SIGNATURES,
    driver="GTiff",
    open_options={"GEOREF_SOURCES": "INTERNAL", "NUM_THREADS": 1},
    described="a self-contained GeoTIFF or Cloud-Optimized GeoTIFF (classic TIFF or BigTIFF)",
)

#: The JP2 signature box (ISO/IEC 15444-1, I.5.1): what recognises a JP2 file.
JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
#: SOC then SIZ: a raw codestream (.j2k, .j2c), which has no box to hold georeferencing.
J2K_SIGNATURE = b"\xff\x4f\xff\x51"

#: JPEG 2000 in its JP2 file format, opened by JP2OpenJPEG alone (GDAL's OpenJPEG-based driver,
#: which decodes on the calling thread: see docs/uploads.md, "JPEG 2000"). GEOREF_SOURCES=INTERNAL
#: stands for the file's own GeoJP2, GMLJP2 and MSIG boxes (GDAL's gcore/gdaljp2abstractdataset.cpp,
#: LoadJP2Metadata), never a .aux.xml (PAM) or a world file (.j2w, .wld): GDAL's default
#: "PAM,INTERNAL,WORLDFILE" would take both. The header is checked before the driver parses it
#: (:mod:`.jpeg2000`).
JPEG2000 = UploadFormat(
    name="JPEG 2000",
    signatures=(JP2_SIGNATURE,),
    driver="JP2OpenJPEG",
    open_options={"GEOREF_SOURCES": "INTERNAL"},
    described="a JPEG 2000 (JP2) file georeferenced by its own GeoJP2 or GMLJP2 box",
    # JP2OpenJPEG has no NUM_THREADS open option (GDAL warns "does not support open option"): it
    # takes GDAL_NUM_THREADS, and when a read spans several JPEG 2000 tiles that the block cache can
    # hold, decodes them at once on GDAL's pool, each thread opening the file by its name (seen in a
    # web-optimized JP2 job once the block cache was its configured size: through rasterio's opener
    # then, whose files were known to one thread only, those opens failed and the read failed as if
    # the file were corrupt), and reads on GDAL's threads must not reach the plugin
    # (reading/source.py, UPLOAD_READ_THREADS: they are refused). So the pool has one thread while a JP2 is open: the
    # warper and the tile's encoder then run on one thread too, for JP2 uploads only.
    gdal_config={"GDAL_NUM_THREADS": 1},
)


@dataclass(frozen=True)
class DocumentFormat(UploadFormat):
    """A format recognised as a JSON object (blank lines or a byte-order mark may come first)."""

    def recognises(self, head: bytes) -> bool:
        return looks_like_document(head)


#: A scene document (tilecommit/scene_documents.py): JSON naming band files beside it, stacked by
#: a VRT the app writes itself (reading/scene_document.py); the document is never given to GDAL.
SCENE_DOCUMENT = DocumentFormat(
    name="scene document",
    signatures=(b"{",),
    driver="VRT",
    described="a scene document naming band files in the same container (a STAC item or a tilecommit:scene list)",
    # Its members may be JPEG 2000 files, read while the stack is open: as a JP2 upload's.
    gdal_config=JPEG2000.gdal_config,
)

#: The NetCDF family: classic (``CDF\x01``), 64-bit offset (``CDF\x02``) and netCDF-4, which is
#: HDF5 (its signature at byte 0; HDF5 also allows it at 512, 1024... after a user block, which is
#: not accepted), all opened by GDAL's netCDF driver, which reads the CF conventions (the
#: ``grid_mapping`` variable, the coordinate variables). An HDF5 file that is no netCDF-4 file is
#: read by the same driver through the netCDF library (CF attributes, dimension scales).
#: Everything that makes it safe, from the structure checks before GDAL opens it to the copy it
#: reads, is in :mod:`.netcdf`.
NETCDF_SIGNATURES = (b"CDF\x01", b"CDF\x02", b"\x89HDF\r\n\x1a\n")
NETCDF = UploadFormat(
    name="NetCDF",
    signatures=NETCDF_SIGNATURES,
    driver="netCDF",
    described=(
        "a NetCDF file following the CF conventions (classic, 64-bit offset, or netCDF-4/HDF5 with no "
        "external link, external storage or virtual dataset)"
    ),
    local_copy=True,
)

#: The formats an upload may be in, recognised in this order from its first bytes.
UPLOAD_FORMATS: tuple[UploadFormat, ...] = (TIFF, JPEG2000, NETCDF, SCENE_DOCUMENT)

ACCEPTED_FORMATS = "; ".join(fmt.described for fmt in UPLOAD_FORMATS)

#: Signatures of formats that are refused, for a message that says what the file is and why.
#: Formats in the first group name other files or URLs; the rest are plain images without
#: georeferencing of their own, archives or containers of several datasets.
_KNOWN_FORMATS: tuple[tuple[bytes, str], ...] = (
    (b"<VRTDataset", "a GDAL VRT, an XML file whose bands name other files or URLs as their sources"),
    (b"<GDAL_WMS", "a GDAL WMS/TMS service description, which names URLs to fetch"),
    (b"<WMS_Capabilities", "a WMS capabilities document, which names URLs to fetch"),
    (b"<MRFMeta", "an MRF index, which names separate data and index files"),
    (b"<PAMDataset", "a GDAL .aux.xml sidecar, which only describes another file"),
    (b"EHFA_HEADER_TAG", "an ERDAS Imagine (HFA) file, which can keep its pixels in a separate .ige file"),
    (b"PDS_VERSION_ID", "a PDS label, which names the file that holds the pixels"),
    (b"ENVI", "an ENVI header, which describes a separate raw data file"),
    (
        J2K_SIGNATURE,
        "a raw JPEG 2000 codestream (.j2k, .j2c), which has no box to hold georeferencing (only a world file or "
        ".aux.xml beside it could place it, and those are never read); wrap it in a JP2 file with its GeoJP2 box "
        "(`gdal_translate -of JP2OpenJPEG in.j2k out.jp2` where the sidecar is)",
    ),
    (b"\x89PNG\r\n\x1a\n", "a PNG image (georeferenced only through sidecar files)"),
    (b"\xff\xd8\xff", "a JPEG image (georeferenced only through sidecar files)"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"\x1f\x8b", "a gzip stream"),
    (b"GRIB", "a GRIB message"),
    (b"<", "an XML or HTML document"),
)


def describe_header(head: bytes) -> str | None:
    """What a file starting with ``head`` is, in words; None for a TIFF or unrecognised bytes."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")  # a UTF-8 byte-order mark and blank lines before XML/JSON
    if text.startswith(b"<?xml"):
        # The root element follows the declaration (and perhaps comments): look a little further.
        after = text.split(b"?>", 1)[-1].lstrip()
        text = after if after else text
    for signature, what in _KNOWN_FORMATS:
        if text.startswith(signature):
            return what
    return None


def is_tiff(head: bytes) -> bool:
    return TIFF.recognises(head)


def format_of_driver(driver: str) -> UploadFormat:
    """The accepted format a dataset GDAL opened with ``driver`` is in."""
    return next(fmt for fmt in UPLOAD_FORMATS if fmt.driver == driver)


def recognised_format(head: bytes) -> UploadFormat | None:
    """The accepted format a file starting with ``head`` is in (None: none of them)."""
    return next((fmt for fmt in UPLOAD_FORMATS if fmt.recognises(head)), None)


def check_upload_content(path: str, head: bytes, size: int | None) -> UploadFormat:
    """The accepted format of an upload, from the file's first bytes, before GDAL parses it.

    Raises :class:`InvalidRasterError` (empty, unrecognised bytes) or
    :class:`UnsupportedRasterError` (a format GDAL reads that is not accepted), each saying what
    the file is and what is accepted.
    """
    if size == 0 or (size is None and not head):
        raise InvalidRasterError(
            f"{path} is empty (0 bytes): nothing was uploaded, or the upload has not been committed yet; "
            f"upload the raster itself ({ACCEPTED_FORMATS})"
        )
    fmt = recognised_format(head)
    if fmt is not None:
        return fmt
    what = describe_header(head)
    if what is not None:
        raise UnsupportedRasterError(
            f"{path} is {what}; accepted: {ACCEPTED_FORMATS}, which names no other file or URL: convert "
            "it first (e.g. `gdal_translate -of COG in out.tif` on a machine that has its sources) and "
            "upload the result"
        )
    raise InvalidRasterError(f"{path} is not a TIFF (it starts with {head[:8]!r}): accepted: {ACCEPTED_FORMATS}")


def upload_gdal_options(path: str, upload_format: UploadFormat | None = None) -> dict[str, str | int]:
    """GDAL configuration while an upload is open: GDAL's network file systems closed.

    The upload itself is read through the app's reader (:mod:`.source`), never through GDAL's
    network layer. GDAL's curl-based file systems (``/vsiaz/``, ``/vsicurl/``, ``/vsis3/``, ...)
    refuse every name but ``CPL_VSIL_CURL_ALLOWED_FILENAME`` when it is set (``IsAllowedFilename``
    in GDAL's ``port/cpl_vsil_curl.cpp``); set to the upload's plugin path, which is no URL, any
    URL or blob a file could name fails without a request. ``upload_format``'s own configuration
    (:attr:`UploadFormat.gdal_config`) is added.
    """
    own = dict(upload_format.gdal_config) if upload_format is not None else {}
    return {**own, "CPL_VSIL_CURL_ALLOWED_FILENAME": path}
