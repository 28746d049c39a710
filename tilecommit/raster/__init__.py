"""The geospatial half: inspect a source, render windows as COG tiles, assemble the mosaic.

- :mod:`.scene`: :class:`SceneInfo` and :func:`inspect_source` (the bad-input gate).
- :mod:`.tiles`: :func:`render_tile` and the tile encoding (:func:`encode_tile`).
- :mod:`.mosaic`: :func:`assemble_mosaic`; its parts: :mod:`.pyramid`, :mod:`.block_sources`,
  :mod:`.block_copy`, :mod:`.copy_plan` and :mod:`.server_copy` (the service copies the tiles' blocks),
  :mod:`.staging` (Put Block, create-only commits), :mod:`.checks`, :mod:`.vrt`, :mod:`.sidecars`.
- :mod:`.attempt`: what one assembly attempt owns (its block ids, its temporary directory).
- :mod:`.scrub`: verify a finished job's tiles against its source and repair them (If-Match).
- :mod:`.tiff`: the few TIFF structures block copying needs.
- :mod:`.stac`: STAC item and quicklook.
- :mod:`.env`: the GDAL settings that bound memory.
"""

from ..grid import Window, plan_windows
from .env import BLOCK_SIZE, gdal_config, gdal_env
from .mosaic import (
    MosaicCheckError,
    MosaicResult,
    assemble_mosaic,
    mosaic_overview_levels,
)
from .scene import SUPPORTED_DTYPES, SceneInfo, inspect_source
from .source import LocalFile, PinnedBlob, Source
from .tiles import TileResult, encode_tile, render_tile, tile_overview_count

__all__ = [
    "LocalFile",
    "PinnedBlob",
    "Source",
    "BLOCK_SIZE",
    "SUPPORTED_DTYPES",
    "MosaicCheckError",
    "MosaicResult",
    "SceneInfo",
    "TileResult",
    "Window",
    "assemble_mosaic",
    "encode_tile",
    "gdal_config",
    "gdal_env",
    "inspect_source",
    "mosaic_overview_levels",
    "plan_windows",
    "render_tile",
    "tile_overview_count",
]
