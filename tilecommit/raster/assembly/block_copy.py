"""Block copy: the mosaic laid out from the tiles' own compressed blocks, and planned.

Windows are a multiple of the 256-pixel block, so every tile block is a mosaic block: the
mosaic's full resolution and the overview levels the tiles carry are the tiles' blocks in a new
TIFF layout (:mod:`tilecommit.raster.tiff`, :func:`.pyramid.plan_tile_levels`). Only the coarser
levels are computed, by GDAL, from a local copy of the last reused level.

:func:`prepare_block_copy` does the part both block-copy strategies share (tile heads, the
planned directories, the coarse levels); :func:`planned_block_copy` adds the checked head and
the copy plan, pinned to the tile versions, which the ``server`` strategy stages and against
which any block-copied mosaic is verified. The ``blocks`` strategy writes the same layout
through this process (:mod:`.blocks_strategy`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import rasterio
from azure.storage.blob import ContainerClient
from rasterio.enums import Resampling
from rasterio.errors import NotGeoreferencedWarning

from ... import profiles
from ...errors import IncompatibleTilesError, MosaicCheckError
from ...grid import Window
from ...settings import Settings
from ...spec import OutputSpec
from ...usage import ContextExecutor
from .. import tiff
from ..env import gdal_env
from ..gdal_errors import gdal_step
from ..reading.scene import SceneInfo
from .block_sources import FETCH_THREADS, TILE_HEAD_BYTES, BlockFetcher, FileRangeSource, Head, read_tile_heads
from .checks import check_planned_mosaic
from .coarse_levels import (
    Intermediates,
    check_tree_contents,
    read_carried_intermediates,
    read_intermediates,
    stitched_levels,
)
from .copy_plan import CopyPlan, plan_copy
from .pyramid import halve_ceil, levels_of, levels_to_fit, plan_tile_levels
from .reduction import plan_level_tree
from .strategy import PLAN_SHA256_METADATA_KEY, MosaicJob, PlannedMosaic


def build_coarse_levels(
    scene: SceneInfo,
    base_directory: tiff.OutputDirectory,
    nodata_tag: tiff.Tag | None,
    byte_order: str,
    first_level: int,
    fetch: BlockFetcher,
    workdir: str,
    settings: Settings,
    spec: OutputSpec,
    count: int | None = None,
) -> tuple[list[tiff.OutputDirectory], FileRangeSource]:
    """The levels below ``first_level``, computed by GDAL from a copy of level ``first_level``
    (``count`` of them: by default until one fits a block, or the web-optimized job's count).

    The copy is written block for block like the mosaic; GDAL then builds its internal overviews
    (bounded by GDAL_CACHEMAX and GDAL_OVR_CHUNK_MAX_SIZE) and their directories become the
    mosaic's coarse levels. A level with an internal mask is copied with it; GDAL then builds the
    mask's overviews too (after the image's, in the copy) and each is paired with its image by size.
    They are encoded as the tiles are, to the job's profile (:func:`tilecommit.profiles.overview_options`).
    The copy and the levels are this assembly's temporary disk, which validation bounded from the
    scene's numbers (:func:`.pyramid.check_temporary_disk`).
    """
    base_path = os.path.join(workdir, f"level{first_level}.tif")
    tags = dict(base_directory.tags)
    tags.pop(tiff.NEW_SUBFILE_TYPE, None)
    if nodata_tag is not None:
        tags[tiff.GDAL_NODATA] = nodata_tag
    base = tiff.OutputDirectory(
        tags=tags, blocks=base_directory.blocks, width=base_directory.width, height=base_directory.height
    )
    if base_directory.mask is not None:
        mask = base_directory.mask
        subfile = tiff.pack_tag(tiff.NEW_SUBFILE_TYPE, tiff.TYPE_LONG, [tiff.SUBFILE_MASK], byte_order)
        mask_tags = {**mask.tags, subfile.code: subfile}
        base.mask = tiff.OutputDirectory(tags=mask_tags, blocks=mask.blocks, width=mask.width, height=mask.height)
    with open(base_path, "wb") as out:
        tiff.TiffWriter(byte_order).write(out, [base], fetch)
    if count is None:
        count = levels_to_fit(base.width, base.height, halve_ceil, spec.block_size)
        if spec.choice.web_optimized:  # rio-cogeo's pyramid: as many as the job's level count leaves
            count = levels_of(scene, spec) - first_level
    factors = [2**j for j in range(1, count + 1)]
    # GDAL builds them in blocks of GDAL_TIFF_OVR_BLOCKSIZE: the spec's.
    encoding = {
        **profiles.coarse_level_options(spec.choice, scene.dtype, scene.count),
        "GDAL_TIFF_OVR_BLOCKSIZE": spec.block_size,
    }
    with (
        gdal_env(settings, encoding),
        warnings.catch_warnings(),
    ):
        # The level copy carries no georeferencing on purpose: only its blocks are reused.
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        step = f"computing the mosaic's overview levels below level {first_level}"
        with (
            gdal_step(step, window=f"level {first_level}, {base.width}x{base.height}"),
            rasterio.open(base_path, "r+") as dst,
        ):
            dst.build_overviews(factors, Resampling[spec.overview_resampling(scene.overview_resampling)])
    source = FileRangeSource(base_path)
    with open(base_path, "rb") as f:
        layout = tiff.read_layout(f.read(TILE_HEAD_BYTES), source.read, max_directories=2 * len(factors) + 4)

    def coarse(d: tiff.Directory, subfile_type: int, what: str) -> tiff.OutputDirectory:
        if d.tile_width != spec.block_size or d.tile_height != spec.block_size or d.planar_config != 1:
            raise MosaicCheckError(f"computed {what} has blocks of {d.tile_width}x{d.tile_height}")
        blocks = [tiff.BlockRef("coarse", o, c) for o, c in zip(d.block_offsets, d.block_byte_counts, strict=True)]
        tags = tiff.copyable_tags(d, width=d.width, height=d.height, subfile_type=subfile_type)
        return tiff.OutputDirectory(tags=tags, blocks=blocks, width=d.width, height=d.height)

    reduced = [d for d in layout.directories if d.subfile_type == tiff.SUBFILE_REDUCED]
    masks = {
        (d.width, d.height): d for d in layout.directories if d.subfile_type == tiff.SUBFILE_REDUCED | tiff.SUBFILE_MASK
    }
    out_dirs = []
    for j, d in enumerate(reduced, start=1):
        image = coarse(d, tiff.SUBFILE_REDUCED, f"level {first_level + j}")
        if base.mask is not None:
            mask_dir = masks.get((d.width, d.height))
            if mask_dir is None:
                raise MosaicCheckError(f"GDAL built no mask for computed level {first_level + j}")
            image.mask = coarse(mask_dir, tiff.SUBFILE_REDUCED | tiff.SUBFILE_MASK, f"level {first_level + j} mask")
        out_dirs.append(image)
    if len(out_dirs) != len(factors):
        raise MosaicCheckError(f"GDAL built {len(out_dirs)} coarse levels, {len(factors)} were asked for")
    return out_dirs, source


@dataclass
class BlockCopyLayout:
    """A planned block-copy mosaic: its directories (full resolution first), the writer that lays
    them out, and where each block's bytes are (``sources``: tile keys and ``"coarse"``)."""

    directories: list[tiff.OutputDirectory]
    writer: tiff.TiffWriter
    sources: dict
    fetch: BlockFetcher
    coarse_source: FileRangeSource | None
    #: The sources whose blocks this process stages itself: the coarse levels' (computed here, or
    #: the reduction tree's intermediates of a job from before they were copied, :mod:`.coarse_levels`).
    local_sources: frozenset = frozenset({"coarse"})
    #: The intermediates the service copies from: key -> the manifest row naming the blob and the
    #: ETag each range is pinned to.
    copied: dict = field(default_factory=dict)

    @property
    def evidence_sources(self) -> frozenset:
        """The sources the mosaic's evidence names as local blocks: those staged here and every
        intermediate the service copies, so that a mosaic whose intermediates the service copied
        is named as one whose commit staged them (the same bytes in the same places) and each
        verifies as the other."""
        return self.local_sources | frozenset(self.copied)

    @property
    def levels(self) -> int:
        return len(self.directories) - 1

    def close(self) -> None:
        if self.coarse_source is not None:
            self.coarse_source.close()


@dataclass
class TileLevels:
    """The mosaic's levels that are the tiles' own blocks (full resolution and the overview
    levels the tiles carry), planned from the tiles' heads alone, and the writer of their framing.
    Nothing of the coarse levels is known yet: what the copied ranges are does not depend on them."""

    directories: list[tiff.OutputDirectory]
    writer: tiff.TiffWriter
    sources: dict
    reference: tiff.TiffLayout


def read_tile_levels(
    scene: SceneInfo,
    windows: list[Window],
    summary,
    *,
    tiles: ContainerClient,
    spec: OutputSpec,
    timings: dict[str, float],
    executor: ThreadPoolExecutor,
    known: dict[str, Head] | None = None,
) -> TileLevels:
    """Read the tiles' heads (16 KB each; ``known``: heads a reduction node read, pinned, used
    where they are of the row's version) and plan the levels they make. Raises
    :class:`IncompatibleTilesError` when the tiles cannot be block-copied."""
    started = time.perf_counter()
    sources, heads = read_tile_heads(windows, summary, tiles, executor, known)
    timings["tile_heads"] = time.perf_counter() - started
    reference = heads.groups[0].layout
    for group in heads.groups:  # a group's members share their ghost area, where the framing is said
        framing = (group.layout.block_leaders, group.layout.block_trailers)
        if framing != (reference.block_leaders, reference.block_trailers):
            first = heads.windows[group.members[0]].id
            raise IncompatibleTilesError(f"tile {first} frames its blocks differently from tile 0000_0000")
    writer = tiff.TiffWriter(
        reference.byte_order,
        ghost=reference.ghost,
        leaders=reference.block_leaders,
        trailers=reference.block_trailers,
    )
    started = time.perf_counter()
    directories = plan_tile_levels(scene, heads, spec)
    timings["tile_levels"] = time.perf_counter() - started
    return TileLevels(directories, writer, sources, reference)


def prepare_block_copy(job: MosaicJob, executor: ThreadPoolExecutor) -> BlockCopyLayout:
    """Read the tiles' heads, plan the mosaic's directories and compute its coarse levels.

    Raises :class:`IncompatibleTilesError` when the tiles cannot be block-copied. The only bytes
    of pixel data read here are those of the last reused level (1/16 of the pixels with
    1024-pixel windows), from which GDAL computes the coarse levels into the job's ``workdir``.
    """
    scene, spec, timings = job.scene, job.spec, job.timings
    tree = plan_level_tree(scene.width, scene.height, spec, job.job.coarse_levels_per_node)
    intermediates = None
    if tree is not None:
        # Computed by the reduction tree's activities before this commit: only stitched here. Its
        # intermediates carry the heads of their tiles (and of the nodes below), read pinned by the nodes.
        started = time.perf_counter()
        read = read_carried_intermediates if job.job.coarse_levels_copied else read_intermediates
        intermediates = read(job.job, job.stores, tree, executor)
        check_tree_contents(intermediates, job.windows, job.summary, job.job_id)
        timings["intermediates"] = time.perf_counter() - started
    levels = read_tile_levels(
        scene,
        job.windows,
        job.summary,
        tiles=job.stores.tiles,
        spec=spec,
        timings=timings,
        executor=executor,
        known=intermediates.heads if intermediates is not None else None,
    )
    started = time.perf_counter()
    directories, sources, reference = list(levels.directories), levels.sources, levels.reference
    fetch = BlockFetcher(sources, executor, spec.block_size)
    coarse_source = None
    local_sources = frozenset({"coarse"})
    copied: dict = {}
    if intermediates is not None:
        directories.extend(tree_levels(scene, spec, levels, intermediates, copied=bool(job.job.coarse_levels_copied)))
        sources.update(intermediates.sources)
        if job.job.coarse_levels_copied:
            copied, local_sources = intermediates.rows, frozenset()
        else:
            local_sources = frozenset(intermediates.sources)
    elif coarse_levels_needed(scene, spec, directories):
        nodata = reference.directories[0].tags.get(tiff.GDAL_NODATA)
        coarse, coarse_source = build_coarse_levels(
            scene,
            directories[-1],
            nodata,
            reference.byte_order,
            len(directories) - 1,
            fetch,
            job.workdir,
            job.stores.settings,
            spec,
        )
        sources["coarse"] = coarse_source
        directories.extend(coarse)
    timings["coarse_levels"] = time.perf_counter() - started
    return BlockCopyLayout(directories, levels.writer, sources, fetch, coarse_source, local_sources, copied)


def coarse_levels_needed(scene: SceneInfo, spec: OutputSpec, directories: list[tiff.OutputDirectory]) -> bool:
    """Whether levels below the tiles' own ``directories`` are due: the last is larger than a
    block, or a web-optimized job's level count asks for more."""
    if spec.choice.web_optimized:
        return levels_of(scene, spec) > len(directories) - 1
    return directories[-1].width > spec.block_size or directories[-1].height > spec.block_size


def tree_levels(
    scene: SceneInfo, spec: OutputSpec, levels: TileLevels, intermediates: Intermediates, *, copied: bool
) -> list[tiff.OutputDirectory]:
    """The coarse levels the tree's ``intermediates`` make below the tiles' ``levels``, once
    found to start where those end. ``copied``: the service copies their blocks with the leaders
    and trailers they hold, so intermediates must frame their blocks as the tiles (and so the mosaic) do."""
    directories = levels.directories
    needed = coarse_levels_needed(scene, spec, directories)
    if not needed or intermediates.tree.first != len(directories) - 1:
        raise MosaicCheckError(
            f"the level tree starts at level {intermediates.tree.first}, the tiles' levels end at "
            f"{len(directories) - 1} (coarse levels needed: {needed})"
        )
    framing = (levels.reference.block_leaders, levels.reference.block_trailers)
    for key, layout in intermediates.layouts.items() if copied else ():
        if (layout.block_leaders, layout.block_trailers) != framing:
            raise MosaicCheckError(
                f"intermediate {key} frames its blocks otherwise than the tiles: run the job again to compute it anew"
            )
    return stitched_levels(intermediates)


def copied_sources(windows: list[Window], summary, intermediates: dict) -> tuple[dict, dict[str, str]]:
    """(versions, blob names) of everything the mosaic's ranges copy: each tile's, by window, from
    its manifest row (``summary``), and each intermediate's the service copies, by its row's key."""
    versions = {w.id: summary.entries[w.id].etag for w in windows}
    uris = {w.id: summary.entries[w.id].uri for w in windows}
    for key, row in intermediates.items():
        versions[key], uris[key] = row.etag, row.uri
    return versions, uris


@dataclass(frozen=True)
class BlockCopy:
    """A block-copy mosaic planned, nothing staged: the layout (its local sources still open), the
    copy plan, the tile versions its ranges are pinned to, and what the mosaic must be."""

    layout: BlockCopyLayout
    plan: CopyPlan
    #: The version each copied range is pinned to, and the blob it is copied from: every tile's
    #: (by window) and every intermediate's the service copies (by its row's key).
    versions: dict[str, str | None]
    uris: dict[str, str]
    planned: PlannedMosaic


@contextmanager
def planned_block_copy(job: MosaicJob) -> Iterator[BlockCopy]:
    """The block-copy mosaic these tiles make, planned: tile heads read, coarse levels computed,
    the head checked (:func:`.checks.check_planned_mosaic`), the copy ranges planned and pinned to
    the tile versions the manifest rows recorded. The layout stays open inside the block, for a
    stager that reads the coarse levels from it. Raises :class:`IncompatibleTilesError`."""
    with ContextExecutor(max_workers=FETCH_THREADS, thread_name_prefix="tilefetch") as executor:
        layout = prepare_block_copy(job, executor)
        try:
            started = time.perf_counter()
            head, order, total = layout.writer.block_order(layout.directories)
            check_planned_mosaic(
                head,
                job.scene,
                layout.levels,
                settings=job.stores.settings,
                job_id=job.job_id,
                block_size=job.spec.block_size,
                shorter_side=job.spec.choice.web_optimized,
            )
            framing = {"leaders": layout.writer.leaders, "trailers": layout.writer.trailers}
            plan = plan_copy(head, order, total, **framing, local_sources=layout.local_sources)
            versions, uris = copied_sources(job.windows, job.summary, layout.copied)
            # Named by the tiles' contents, not their versions: a run that renders purged tiles
            # again makes new versions of the same bytes, and must meet the same mosaic.
            contents = {w.id: job.summary.entries[w.id].sha256 for w in job.windows}
            named = plan
            if layout.evidence_sources != layout.local_sources:
                named = plan_copy(head, order, total, **framing, local_sources=layout.evidence_sources)
            evidence = (PLAN_SHA256_METADATA_KEY, named.digest(contents))
            job.timings["check"] = time.perf_counter() - started
            yield BlockCopy(
                layout, plan, versions, uris, PlannedMosaic("server", layout.levels, evidence, nbytes=total, head=head)
            )
        finally:
            layout.close()


def plan_block_copy(job: MosaicJob) -> PlannedMosaic:
    """What an existing block-copied mosaic of these tiles must be (:func:`planned_block_copy`)."""
    with planned_block_copy(job) as copy:
        return copy.planned
