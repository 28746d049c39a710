"""The ``vrt`` strategy: a VRT over the tiles, translated by GDAL's COG driver into a local file.

Used only when the tiles cannot be block-copied (tiles from another encoding) and as the
benchmark's reference. It decodes and re-encodes the whole scene and needs about 2.6x the
mosaic in temporary disk (:func:`estimate_vrt_temp_bytes`). The file is checked
(:func:`.checks.check_mosaic_file`) before the shared commit uploads it, create-only.

GDAL reads the tiles from local copies, never from storage: each copy is fetched at the version
its manifest row recorded (``If-Match`` on the row's ETag, every byte counted,
:class:`~.block_sources.BlobRangeSource`) and its sha256 compared with the row's before the VRT
names it. GDAL's own ``/vsiaz/`` reader could neither pin the version nor be trusted to fail a
read storage did not answer in full.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from xml.sax.saxutils import escape

import rasterio.shutil
from azure.storage.blob import ContainerClient

from ... import gates
from ...errors import IncompleteManifestError
from ...grid import Window
from ...spec import OutputSpec
from ...usage import ContextExecutor
from ..env import NUM_THREADS, gdal_env
from ..gdal_errors import gdal_step
from ..reading import metadata
from ..reading.budgets import TEMPORARY_DISK_BYTES
from ..reading.scene import SceneInfo, as_crs
from ..tiling.encode import cog_creation_options, tile_overview_count, write_cog
from .block_sources import FETCH_THREADS, BlobRangeSource
from .checks import check_mosaic_file
from .pyramid import levels_of
from .strategy import BuiltMosaic, MosaicJob, PlannedMosaic

logger = logging.getLogger(__name__)

#: Temporary disk the VRT path may need before it logs a WARNING: an assembly's budget
#: (:data:`~..reading.budgets.TEMPORARY_DISK_BYTES`; the block-copy paths need only the
#: coarse-level copy, which validation checks against it: :func:`.pyramid.check_temporary_disk`).
TEMP_BUDGET_BYTES = TEMPORARY_DISK_BYTES


def fetch_tiles(windows: list[Window], summary, tiles: ContainerClient, folder: str) -> dict[str, str]:
    """Copy each window's tile into ``folder`` at the version and with the sha256 its row recorded;
    window id -> local path. Raises :class:`IncompleteManifestError` for a tile that is not what
    its row says, :class:`StorageFaultError` for a read storage did not answer in full."""
    os.makedirs(folder, exist_ok=True)

    def one(window: Window) -> tuple[str, str]:
        entry = summary.entries[window.id]
        body = BlobRangeSource(tiles, entry.uri, entry.nbytes, entry.etag or "", window.id).read(0, entry.nbytes)
        if entry.sha256 and gates.sha256_hex(body) != entry.sha256:
            raise IncompleteManifestError(
                f"tile {entry.uri} does not hold what its manifest row recorded (sha256 {entry.sha256}); "
                "repair the job's tiles (verify --repair) and re-run",
                mismatched=[window.id],
            )
        path = os.path.join(folder, f"{window.id}.tif")
        with open(path, "wb") as f:
            f.write(body)
        return window.id, path

    with ContextExecutor(max_workers=FETCH_THREADS, thread_name_prefix="vrtfetch") as executor:
        return dict(executor.map(one, windows))


def _vrt_xml(scene: SceneInfo, windows: list[Window], paths: dict[str, str], block_size: int) -> str:
    crs = as_crs(scene.crs).to_wkt(version="WKT2_2019")
    a, b, c, d, e, f = scene.transform[:6]
    gdal_type = {
        "uint8": "Byte",
        "int8": "Int8",
        "uint16": "UInt16",
        "int16": "Int16",
        "uint32": "UInt32",
        "int32": "Int32",
        "float32": "Float32",
        "float64": "Float64",
    }[scene.dtype]
    lines = [
        f'<VRTDataset rasterXSize="{scene.width}" rasterYSize="{scene.height}">',
        f"  <SRS>{escape(crs)}</SRS>",
        f"  <GeoTransform>{c!r}, {a!r}, {b!r}, {f!r}, {d!r}, {e!r}</GeoTransform>",
    ]

    def sources(band: str) -> list[str]:
        out = []
        for w in windows:
            path = paths[w.id]
            out.append(
                f'    <SimpleSource><SourceFilename relativeToVRT="0">{escape(path)}</SourceFilename>'
                f"<SourceBand>{band}</SourceBand>"
                f'<SourceProperties RasterXSize="{w.width}" RasterYSize="{w.height}" DataType="{gdal_type}" BlockXSize="{block_size}" BlockYSize="{block_size}"/>'
                f'<SrcRect xOff="0" yOff="0" xSize="{w.width}" ySize="{w.height}"/>'
                f'<DstRect xOff="{w.col_off}" yOff="{w.row_off}" xSize="{w.width}" ySize="{w.height}"/></SimpleSource>'
            )
        return out

    if scene.mask == "per-dataset":
        lines.append('  <MaskBand><VRTRasterBand dataType="Byte">')
        lines += sources("mask,1")
        lines.append("  </VRTRasterBand></MaskBand>")
    for band in range(1, scene.count + 1):
        lines.append(f'  <VRTRasterBand dataType="{gdal_type}" band="{band}">')
        if scene.nodata is not None:
            lines.append(f"    <NoDataValue>{scene.nodata!r}</NoDataValue>")
        if band <= len(scene.colorinterp):
            lines.append(f"    <ColorInterp>{scene.colorinterp[band - 1].capitalize()}</ColorInterp>")
        description = scene.descriptions[band - 1] if band <= len(scene.descriptions) else None
        if description:
            lines.append(f"    <Description>{escape(description)}</Description>")
        lines += sources(str(band))
        lines.append("  </VRTRasterBand>")
    lines.append("</VRTDataset>")
    return "\n".join(lines)


def _pyramid_share(levels: int) -> float:
    """Bytes of a pyramid of ``levels`` overviews relative to its full resolution (1 + 1/4 + ...)."""
    return sum(0.25**k for k in range(levels + 1))


#: Size of the COG driver's temporary overview file (``*.ovr.tmp``) relative to the overview
#: levels' size in the finished mosaic: measured 2.4 at 2048² and 4096² x 3 uint16 (GDAL 3.10.3).
VRT_OVR_TMP_FACTOR = 2.4


def estimate_vrt_temp_bytes(scene: SceneInfo, summary, spec: OutputSpec) -> int:
    """Temporary disk the VRT path needs at its peak, from the tiles' stored sizes.

    The mosaic compresses about as its tiles do: their bytes, less the share of their own
    overviews, plus the mosaic's full pyramid (597 MB of mosaic from 588 MB of tiles at 10240²).
    While it writes, the COG driver also holds the overview levels in a temporary file beside
    the output (CPL_TMPDIR = workdir), larger than they end up. Measured peaks: 1.59 and 1.60
    times the mosaic (2048², 4096²), before the tiles were read from local copies; this estimate
    came within 1 % of both, and now adds the copies' bytes (about 1x the mosaic).
    """
    full = summary.total_bytes / _pyramid_share(tile_overview_count(spec.window_size, spec.block_size))
    pyramid = _pyramid_share(levels_of(scene, spec))
    # The tiles' local copies (fetch_tiles) lie beside the output until it is written.
    return int(summary.total_bytes + full * pyramid + full * (pyramid - 1) * VRT_OVR_TMP_FACTOR)


def build(job: MosaicJob) -> BuiltMosaic:
    """Write the mosaic into the job's ``workdir`` through the COG driver and check the file;
    nothing is committed (the shared commit uploads the file and removes it)."""
    out_path = os.path.join(job.workdir, "mosaic.tif")
    nbytes, levels = build_mosaic_vrt(job, out_path)
    sha256 = file_sha256(out_path)
    started = time.perf_counter()
    check_mosaic_file(
        out_path,
        job.scene,
        levels,
        settings=job.stores.settings,
        block_size=job.spec.block_size,
        shorter_side=job.spec.choice.web_optimized,
    )
    job.timings["check"] = time.perf_counter() - started
    planned = PlannedMosaic("vrt", levels, (gates.SHA256_METADATA_KEY, sha256), nbytes=nbytes)
    return BuiltMosaic(planned, {"sent_from_instance": nbytes}, sha256=sha256, path=out_path)


def build_mosaic_vrt(job: MosaicJob, out_path: str, num_threads: int = NUM_THREADS) -> tuple[int, int]:
    """The mosaic at ``out_path``, written by the COG driver from a VRT over local copies of the
    tiles; (its size, its overview levels). Its size is estimated first, and a WARNING logged
    when the temporary disk it needs exceeds :data:`TEMP_BUDGET_BYTES`."""
    scene, windows, summary, spec, workdir = job.scene, job.windows, job.summary, job.spec, job.workdir
    levels = levels_of(scene, spec)
    _warn_of_its_costs(job)
    vrt_path = os.path.join(workdir, "mosaic.vrt")
    paths = fetch_tiles(windows, summary, job.stores.tiles, os.path.join(workdir, "tiles"))
    with open(vrt_path, "w", encoding="utf-8") as f:
        f.write(_vrt_xml(scene, windows, paths, spec.block_size))
    # The mosaic says what its tiles say, and each tile says what the source does
    # (tilecommit/raster/reading/metadata.py): one tile's tags onto the VRT, which the COG driver copies.
    with rasterio.open(paths[windows[0].id]) as tile, rasterio.open(vrt_path, "r+") as vrt:
        metadata.carry(tile, vrt)
    options = cog_creation_options(
        scene.dtype,
        block_size=spec.block_size,
        overview_count=levels,
        resampling=spec.overview_resampling(scene.overview_resampling),
        choice=spec.choice,
        num_threads=num_threads,
    )
    if levels:
        # A VRT over tiles lends their overviews; the COG driver would then copy those (2 of 5
        # levels when measured) instead of computing every level.
        options["OVERVIEWS"] = "IGNORE_EXISTING"
    started = time.perf_counter()
    # The COG driver writes its overviews to a temporary file beside the output: keep it in workdir.
    with (
        gdal_env(
            job.stores.settings, {**(job.stores.gdal_options or {}), "CPL_TMPDIR": workdir}, num_threads=num_threads
        ),
        gdal_step(
            "assembling the mosaic through a VRT (COG driver)",
            window=f"{scene.width}x{scene.height}, {len(windows)} tiles",
        ),
    ):
        write_cog(vrt_path, out_path, options, choice=spec.choice, dtype=scene.dtype, block_size=spec.block_size)
    job.timings["write"] = time.perf_counter() - started
    return os.path.getsize(out_path), levels


def _warn_of_its_costs(job: MosaicJob) -> None:
    """A WARNING for what the VRT path costs this job beyond the block copy's: a lossy profile's
    second loss, and temporary disk over :data:`TEMP_BUDGET_BYTES`."""
    scene, summary, spec, workdir = job.scene, job.summary, job.spec, job.workdir
    if spec.choice.lossy:
        logger.warning(
            "VRT assembly with the lossy profile %r: the tiles are decoded and the mosaic encoded again, so its "
            "pixels lose twice and are not the tiles' (a LERC error up to twice max_z_error); block copy keeps them",
            spec.profile,
        )
    estimate = estimate_vrt_temp_bytes(scene, summary, spec)
    if estimate > TEMP_BUDGET_BYTES:
        logger.warning(
            "VRT assembly of a %dx%dx%d %s mosaic needs about %d MB of temporary disk in %s (the COG driver's "
            "output file and its overview file), over the %d MB budget: the Consumption plan gives an instance "
            "about 0.5 GB of temporary disk in all, so this may fail there (block copy streams instead)",
            scene.width,
            scene.height,
            scene.count,
            scene.dtype,
            estimate // 10**6,
            workdir,
            TEMP_BUDGET_BYTES // 10**6,
        )


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
