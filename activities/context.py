"""Clients and settings for activities, built once per process from the app settings: the
upload's container and the stores every job step takes (:class:`tilecommit.stores.JobStores`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from azure.storage.blob import ContainerClient

from tilecommit import gates
from tilecommit.settings import Settings, connection_fingerprint
from tilecommit.storage import StorageConnection
from tilecommit.stores import JobStores


@dataclass(frozen=True)
class ActivityContext:
    connection: StorageConnection
    input: ContainerClient
    stores: JobStores

    @property
    def settings(self) -> Settings:
        return self.stores.settings


@lru_cache(maxsize=4)
def _context_for(connection_key: str, settings: Settings) -> ActivityContext:
    """Clients for one connection (``connection_key`` only keys the cache) and one set of settings:
    the code's data connection (``TilecommitData``, else the host's)."""
    connection = StorageConnection.for_data()
    blobs = connection.blob_service()
    # Tiles are written only through the gates: each one Put Blob whatever its size. The output
    # container keeps the SDK's default, so a mosaic uploaded from a file goes up in blocks.
    gated_blobs = connection.blob_service(**gates.SINGLE_PUT_CLIENT_OPTIONS)
    tables = connection.table_service()
    return ActivityContext(
        connection=connection,
        input=blobs.get_container_client(settings.input_container),
        stores=JobStores(
            tiles=gated_blobs.get_container_client(settings.tiles_container),
            output=blobs.get_container_client(settings.output_container),
            manifest=tables.get_table_client(settings.manifest_table),
            settings=settings,
        ),
    )


def activity_context() -> ActivityContext:
    """The process's clients; rebuilt only when the connection or settings change."""
    return _context_for(connection_fingerprint(), Settings.from_env())
