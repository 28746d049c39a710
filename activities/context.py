"""Clients and settings for activities, built once per process from the app settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from tilecommit import gates
from tilecommit.settings import Settings, connection_fingerprint
from tilecommit.spec import spec_of
from tilecommit.storage import StorageConnection


@dataclass(frozen=True)
class ActivityContext:
    settings: Settings
    connection: StorageConnection
    input: ContainerClient
    tiles: ContainerClient
    output: ContainerClient
    manifest: TableClient

    def mosaic_inputs(self, job: dict) -> dict:
        """What every mosaic step (assemble, verify, rebuild) takes besides the job id and the
        scene: the job's stores, settings, output spec and source name."""
        return {
            "tiles": self.tiles,
            "output": self.output,
            "manifest": self.manifest,
            "settings": self.settings,
            "spec": spec_of(job),
            "source_name": job["blob"],
        }


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
        settings=settings,
        connection=connection,
        input=blobs.get_container_client(settings.input_container),
        tiles=gated_blobs.get_container_client(settings.tiles_container),
        output=blobs.get_container_client(settings.output_container),
        manifest=tables.get_table_client(settings.manifest_table),
    )


def activity_context() -> ActivityContext:
    """The process's clients; rebuilt only when the connection or settings change."""
    return _context_for(connection_fingerprint(), Settings.from_env())
