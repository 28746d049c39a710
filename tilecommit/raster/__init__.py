"""The geospatial half: read an upload, render its windows as COG tiles, assemble the mosaic.

Three rooms, each a subpackage:

- :mod:`.reading`: the upload: what it may be, every byte read at the job's version, what it is
  (:func:`inspect_source`, :class:`SceneInfo`);
- :mod:`.tiling`: one window as a tile, committed once (:func:`render_tile`, :func:`encode_tile`);
- :mod:`.assembly`: the tiles as one mosaic with its STAC item and quicklook, committed once and
  verified (:func:`assemble_mosaic`).

Reading imports neither of the others; tiling imports reading; assembly imports both (it reads
the committed mosaic with the reading room's pinned reader, and a VRT mosaic is encoded as a tile
is). At this level, what serves more than one room, or none in particular:

- :mod:`.env`: the GDAL settings that bound memory, under which every room runs GDAL;
- :mod:`.gdal_errors`: GDAL failures named (step, window, GDAL's words), for tiling, assembly,
  the scrub and the activities' job messages;
- :mod:`.tiff`: the TIFF codec. A file format, not a step: it imports no other raster module
  (docs/architecture.md, "Layers", says so and the layer test holds it to that); block copy is its user;
- :mod:`.scrub`: a finished job verified and repaired, its windows as tiling makes them and its
  outputs as the assembly checks and rebuilds them. It uses both rooms, so it stands above them
  and no room imports it.
"""

from ..errors import MosaicCheckError
from ..grid import Window, plan_windows
from .assembly.commit import MosaicResult
from .assembly.mosaic import assemble_mosaic
from .assembly.pyramid import check_temporary_disk, mosaic_overview_levels
from .env import BLOCK_SIZE, gdal_config, gdal_env
from .reading.scene import SUPPORTED_DTYPES, SceneInfo, inspect_source
from .reading.scene_document import pin_members
from .reading.source import LocalFile, PinnedBlob, Source
from .tiling.encode import encode_tile, tile_overview_count
from .tiling.render import TileResult, render_tile

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
    "check_temporary_disk",
    "encode_tile",
    "gdal_config",
    "gdal_env",
    "inspect_source",
    "mosaic_overview_levels",
    "pin_members",
    "plan_windows",
    "render_tile",
    "tile_overview_count",
]
