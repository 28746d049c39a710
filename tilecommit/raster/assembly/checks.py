"""The checks of a mosaic: planned (its head, before a byte is staged), written (the VRT path's
file) or committed (the blob, read back at its version), it has the shape, georeferencing and
complete pyramid the scene asks for. (That the manifest is complete is :mod:`.manifest_check`'s.)
"""

from __future__ import annotations

import math

import rasterio
from azure.storage.blob import ContainerClient
from rasterio.enums import MaskFlags
from rasterio.io import MemoryFile

from ... import gates, storage
from ...errors import MosaicCheckError
from ...settings import Settings
from ...storage_answers import storage_fault
from ..env import BLOCK_SIZE, gdal_env
from ..gdal_errors import gdal_step
from ..reading.scene import SceneInfo, crs_label, same_crs
from ..reading.source import PinnedBlob, Source, open_upload, reading
from ..reading.upload import upload_gdal_options
from .pyramid import pyramid_problems
from .strategy import MosaicJob


def check_mosaic_file(
    path: str | Source,
    scene: SceneInfo,
    levels: int,
    *,
    settings: Settings,
    gdal_options: dict | None = None,
    label: str | None = None,
    block_size: int = BLOCK_SIZE,
    shorter_side: bool = False,
) -> None:
    """Refuse a mosaic whose shape, georeferencing, blocks or overview levels are not what was
    planned (``block_size``: the job's spec's; ``shorter_side``: a web-optimized job's pyramid,
    :func:`.pyramid.pyramid_problems`).

    ``path`` is anything GDAL opens (the VRT path's temporary file, the planned head of a
    block-copy mosaic in ``/vsimem/``), or the committed blob at the version checked, read
    through the app's pinned reader (:class:`~tilecommit.raster.reading.source.PinnedBlob`).
    Only directories are read, never a block. GDAL's COG validator passes a file with missing
    overview levels (docs/design.md, 'GDAL settings and raster figures'), so the levels are counted here, and their sizes checked.

    A problem seen while storage failed to deliver bytes proves nothing about the file (a
    directory read that was refused can look like a missing level): the committed blob's reader
    records every such read, and :func:`reading` raises it as a retryable storage fault when the
    block ends, before any problem is judged. So the problems judged were read from bytes that
    all arrived (or from a local file): the mosaic is known bad, whatever GDAL's messages said.
    """
    with gdal_env(settings, gdal_options), gdal_step(f"checking {label or path}"), reading(path) as src:
        problems = _mosaic_problems(src, path, scene, levels, block_size, shorter_side)
    if problems:
        raise MosaicCheckError(f"{label or f'assembled mosaic {path}'} is wrong: " + "; ".join(problems))


def _mosaic_problems(
    src, path: str | Source, scene: SceneInfo, levels: int, block_size: int, shorter_side: bool
) -> list[str]:
    problems = []
    if (src.width, src.height, src.count) != (scene.width, scene.height, scene.count):
        problems.append(f"size {src.width}x{src.height}x{src.count}")
    if src.dtypes[0] != scene.dtype:
        problems.append(f"dtype {src.dtypes[0]}")
    if not src.transform.almost_equals(scene.affine, precision=1e-9):
        problems.append(f"transform {tuple(src.transform)[:6]}")
    if not same_crs(src.crs, scene.crs):
        found = "none" if src.crs is None else crs_label(src.crs)
        problems.append(f"crs {found} is not equivalent to the source's {crs_label(scene.crs)}")
    if (src.nodata is None) != (scene.nodata is None) or (
        scene.nodata is not None
        and not (math.isnan(scene.nodata) and math.isnan(src.nodata))
        and src.nodata != scene.nodata
    ):
        problems.append(f"nodata {src.nodata}")
    if scene.mask == "per-dataset" and not all(MaskFlags.per_dataset in flags for flags in src.mask_flag_enums):
        problems.append("no internal mask, while the source has one")
    if scene.colorinterp and [ci.name for ci in src.colorinterp] != scene.colorinterp:
        problems.append(f"colour interpretation {[ci.name for ci in src.colorinterp]} instead of {scene.colorinterp}")
    factors = src.overviews(1)
    if len(factors) != levels:
        problems.append(f"{len(factors)} overview levels instead of {levels}")
    sizes = [(src.width, src.height)]
    for level in range(len(factors)):
        opened = (
            open_upload(path, overview_level=level)
            if isinstance(path, Source)
            else rasterio.open(path, overview_level=level)
        )
        with opened as overview:
            sizes.append((overview.width, overview.height))
    problems += pyramid_problems(sizes, block_size, shorter_side=shorter_side)
    if src.block_shapes[0] != (block_size, block_size) and (src.width > block_size or src.height > block_size):
        problems.append(f"blocks {src.block_shapes[0]}")
    return problems


def check_planned_mosaic(
    head: bytes,
    scene: SceneInfo,
    levels: int,
    *,
    settings: Settings,
    job_id: str = "",
    block_size: int = BLOCK_SIZE,
    shorter_side: bool = False,
) -> None:
    """:func:`check_mosaic_file` on the planned header and directories of a block-copy mosaic.

    Everything the check reads lives in the directories, which are complete before the first
    block is fetched, so a wrong shape, dtype, CRS, transform, nodata or pyramid is refused here
    without a byte sent (the head is a few tens of KB, held in /vsimem/).
    """
    with MemoryFile(head, ext=".tif") as memory:
        check_mosaic_file(
            memory.name,
            scene,
            levels,
            settings=settings,
            label=f"planned mosaic of job {job_id}",
            block_size=block_size,
            shorter_side=shorter_side,
        )


def blob_properties(container: ContainerClient, name: str):
    """The properties of ``name`` in ``container``, or None when there is no such blob."""
    return storage.blob_head(container.get_blob_client(name))


def committed_properties(container: ContainerClient, name: str):
    """The properties of ``name``, which was committed: its absence is a storage fault to retry
    (the retry finds what storage holds then)."""
    props = blob_properties(container, name)
    if props is None:
        raise storage_fault(f"{name} vanished after it was committed")
    return props


def repair_instruction(job_id: str) -> str:
    """What the operator does about a committed output known bad: no re-run can complete over it
    (every assembly verifies the existing mosaic first), so it has to be repaired."""
    return (
        f"job {job_id} cannot complete over it: repair it with `python -m devhost verify {job_id} --repair` "
        "(local host) or the `verify_scene` orchestration (Azure)"
    )


def verify_committed_mosaic(
    job: MosaicJob,
    levels: int,
    *,
    nbytes: int | None = None,
    metadata: dict[str, str | None] | None = None,
    head: bytes | None = None,
    hash_content_from: str | None = None,
) -> None:
    """The checks of :func:`check_mosaic_file` on the job's committed mosaic (``levels`` overview
    levels; directories only, through the pinned reader), after those of what the assembly planned:

    - ``nbytes``: the stored size;
    - ``metadata``: what the blob's metadata must hold, key by key (the level count, the method, the
      evidence: a streamed sha256 or a server-side plan's digest); None for a value this call
      cannot know, which must then be present;
    - ``head``: the planned header and directories the blob must begin with (one ranged read);
    - ``hash_content_from``: a metadata key holding a sha256 the stored bytes must hash to (one full
      read, pinned to the version checked), for a streamed mosaic whose sha256 this call cannot know.

    Raises :class:`MosaicCheckError` when the mosaic is known bad, and a retryable
    :class:`StorageFaultError` when storage did not deliver what it read back (its reader's record,
    :func:`check_mosaic_file`): a check that could not finish never passes.
    """
    output, name, scene, spec = job.stores.output, job.mosaic_name, job.scene, job.spec
    props = committed_properties(output, name)
    problems = []
    stored = props.metadata or {}
    if nbytes is not None and int(props.size) != nbytes:
        problems.append(f"{props.size} bytes, {nbytes} were planned")
    for key, value in (metadata or {}).items():
        if not stored.get(key):
            problems.append(f"no {key} in its metadata")
        elif value is not None and stored[key] != value:
            problems.append(f"{key} {stored[key]}, ours is {value}")
    if head is not None:
        # The version whose properties were just checked (one changed meanwhile is read again).
        stored_head = gates.content_bytes(output.get_blob_client(name), props.etag, length=len(head))
        if stored_head != head:
            problems.append("its head differs from the planned header and directories")
    if hash_content_from and not problems:
        recorded = stored.get(hash_content_from)
        found = gates.content_sha256(output.get_blob_client(name), props.etag)
        if found != recorded:
            problems.append(f"its bytes hash to {found}, its {hash_content_from} says {recorded}")
    if problems:
        raise MosaicCheckError(f"committed mosaic {name}: " + "; ".join(problems))
    # The version just checked, through the app's pinned, counted reader (GDAL's own network file
    # systems closed): no newer version is checked in its place, every request counts as the job's.
    committed = PinnedBlob(output.get_blob_client(name), props.etag, upload=False)
    check_mosaic_file(
        committed,
        scene,
        levels,
        settings=job.stores.settings,
        gdal_options={**(job.stores.gdal_options or {}), **upload_gdal_options(committed.path)},
        label=f"committed mosaic {name}",
        block_size=spec.block_size,
        shorter_side=spec.choice.web_optimized,
    )
