"""What an upload may be: a self-contained TIFF, opened by GTiff alone, or a NetCDF/HDF5 file,
opened by the netCDF driver alone (:mod:`.netcdf`), each recognised by its first bytes.

An upload is data from outside the app. Several formats GDAL reads name other files or URLs
inside them, and GDAL follows those names when it opens the file: a VRT's sources (any path,
``/vsicurl/`` URL or ``/vsiaz/`` blob), an ERDAS Imagine file's ``.ige`` spill file, a GDAL_WMS
or STAC description's URLs, a PDS or ISIS label's data file. Opened as they come, an upload could
make the app send requests to any address its instance reaches (internal ones included) or copy
a file of the instance's disk, or another container's blob, into a tile anyone with access to the
outputs can read. A TIFF names nothing outside itself, so the TIFF family (GeoTIFF, COG, BigTIFF)
is accepted, decided from the content, never from the name, and opened by the GTiff driver
alone. A NetCDF file can name nothing either; a netCDF-4 (HDF5) file can, and is accepted only
once its structure shows it does not (:mod:`.netcdf`). What GDAL could still reach beside the file (sidecars, the network, PROJ grids) is closed
by :func:`upload_gdal_options`, by the reader that serves GDAL the upload's bytes
(:mod:`.source`) and by :func:`tilecommit.raster.env.gdal_config`. See
docs/uploads.md for the whole list and the tests that show each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...errors import InvalidRasterError, UnsupportedRasterError

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
UPLOAD_FORMATS: tuple[UploadFormat, ...] = (TIFF, NETCDF)

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
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "a JPEG 2000 (JP2) file, whose GML boxes can reference other files"),
    (b"\xffO\xffQ", "a raw JPEG 2000 codestream"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image (georeferenced only through sidecar files)"),
    (b"\xff\xd8\xff", "a JPEG image (georeferenced only through sidecar files)"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"\x1f\x8b", "a gzip stream"),
    (b"GRIB", "a GRIB message"),
    (b"{", "a JSON document (a STAC or tile-matrix description names URLs to fetch)"),
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


def upload_gdal_options(path: str) -> dict[str, str]:
    """GDAL configuration while an upload is open: GDAL's network file systems closed.

    The upload itself is read through the app's reader (:mod:`.source`), never through GDAL's
    network layer. GDAL's curl-based file systems (``/vsiaz/``, ``/vsicurl/``, ``/vsis3/``, ...)
    refuse every name but ``CPL_VSIL_CURL_ALLOWED_FILENAME`` when it is set (``IsAllowedFilename``
    in GDAL's ``port/cpl_vsil_curl.cpp``); set to the upload's plugin path, which is no URL, any
    URL or blob a file could name fails without a request.
    """
    return {"CPL_VSIL_CURL_ALLOWED_FILENAME": path}
