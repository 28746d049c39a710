"""Clients and settings for the client functions (the starter, the job API, the retention sweep),
built once per process from the app settings, as the activities' are (activities/context.py).

They need the manifest table (the cancellation rows, the starter's and the retry's reads), the
tiles container (the sweep's deletes), the input container (a backfill's listing) and the output
container (the tile routes' mosaics, the web page's items and collections), from the code's data
connection, which names the same blob endpoint as the blob trigger's
(:meth:`tilecommit.storage.StorageConnection.for_data`): a blob's URL, and so its job id, is
the same whichever of the two hands it over.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from tilecommit.settings import Settings, connection_fingerprint
from tilecommit.storage import StorageConnection

if TYPE_CHECKING:
    from tilecommit.tiles.render import TileMaker


@dataclass(frozen=True)
class ClientContext:
    settings: Settings
    manifest: TableClient
    tiles: ContainerClient
    #: The uploads' container: a backfill lists it (client_functions/backfill_pages.py), and a
    #: scene document's members are looked up there (client_functions/scene_members.py).
    uploads: ContainerClient
    #: The mosaics, items and collections (the tile routes and the web page read them).
    output: ContainerClient


@lru_cache(maxsize=4)
def _context_for(connection_key: str, settings: Settings) -> ClientContext:
    """Clients for one connection (``connection_key`` only keys the cache) and one set of settings:
    the code's data connection (``TilecommitData``, else the host's)."""
    connection = StorageConnection.for_data()
    blobs = connection.blob_service()
    return ClientContext(
        settings=settings,
        manifest=connection.table_service().get_table_client(settings.manifest_table),
        tiles=blobs.get_container_client(settings.tiles_container),
        uploads=blobs.get_container_client(settings.input_container),
        output=blobs.get_container_client(settings.output_container),
    )


@lru_cache(maxsize=4)
def _tile_maker(context: ClientContext) -> TileMaker:
    # Imported here, with the first tile request: rio-tiler and what it imports (morecantile,
    # pydantic) cost every worker about 0.1 CPU-s at start, and most workers never make a tile.
    from tilecommit.tiles.render import TileMaker

    return TileMaker(context.output, context.settings)


def tile_maker() -> TileMaker:
    """The process's tile maker (its mosaics kept open between requests), one per context."""
    return _tile_maker(client_context())


def client_context() -> ClientContext:
    """The process's clients; rebuilt only when the connection or settings change."""
    return _context_for(connection_fingerprint(), Settings.from_env())
