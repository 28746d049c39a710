"""Clients and settings for the client functions (the starter, the job API, the retention sweep),
built once per process from the app settings, as the activities' are (activities/context.py).

They need only the manifest table (the cancellation rows, the starter's and the retry's reads)
and the tiles container (the sweep's deletes), from the code's data connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from tilecommit.settings import Settings, connection_fingerprint
from tilecommit.storage import StorageConnection


@dataclass(frozen=True)
class ClientContext:
    settings: Settings
    manifest: TableClient
    tiles: ContainerClient
    #: The output container: the web page reads a job's item and quicklook, a collection's document.
    outputs: ContainerClient


@lru_cache(maxsize=4)
def _context_for(connection_key: str, settings: Settings) -> ClientContext:
    """Clients for one connection (``connection_key`` only keys the cache) and one set of settings:
    the code's data connection (``TilecommitData``, else the host's)."""
    connection = StorageConnection.for_data()
    return ClientContext(
        settings=settings,
        manifest=connection.table_service().get_table_client(settings.manifest_table),
        tiles=connection.blob_service().get_container_client(settings.tiles_container),
        outputs=connection.blob_service().get_container_client(settings.output_container),
    )


def client_context() -> ClientContext:
    """The process's clients; rebuilt only when the connection or settings change."""
    return _context_for(connection_fingerprint(), Settings.from_env())
