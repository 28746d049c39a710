"""Clients and settings for the client functions (the starter, the job API, the retention sweep),
built once per process from the app settings, as the activities' are (activities/context.py).

They need the manifest table (the cancellation rows, the starter's and the retry's reads), the
tiles container (the sweep's deletes) and the output container (the tile routes' mosaics), from
the code's data connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from tilecommit.settings import Settings, connection_fingerprint
from tilecommit.storage import StorageConnection
from tilecommit.tiles.render import TileMaker


@dataclass(frozen=True)
class ClientContext:
    settings: Settings
    manifest: TableClient
    tiles: ContainerClient
    #: The mosaics, items and collections (the tile routes and the web page read them).
    output: ContainerClient


@lru_cache(maxsize=4)
def _context_for(connection_key: str, settings: Settings) -> ClientContext:
    """Clients for one connection (``connection_key`` only keys the cache) and one set of settings:
    the code's data connection (``TilecommitData``, else the host's)."""
    connection = StorageConnection.for_data()
    return ClientContext(
        settings=settings,
        manifest=connection.table_service().get_table_client(settings.manifest_table),
        tiles=connection.blob_service().get_container_client(settings.tiles_container),
        output=connection.blob_service().get_container_client(settings.output_container),
    )


@lru_cache(maxsize=4)
def _tile_maker(context: ClientContext) -> TileMaker:
    return TileMaker(context.output, context.settings)


def tile_maker() -> TileMaker:
    """The process's tile maker (its mosaics kept open between requests), one per context."""
    return _tile_maker(client_context())


def client_context() -> ClientContext:
    """The process's clients; rebuilt only when the connection or settings change."""
    return _context_for(connection_fingerprint(), Settings.from_env())
