"""Where a job's steps read and write, and what they run under: :class:`JobStores`.

Every step of every job takes the same stores beside the job itself (:class:`tilecommit.jobs.Job`):
an activity builds them once from the app settings (activities/context.py), a test or a bench
from its own containers. What a job's outputs are made to is never in here: that is the job's
spec, fixed when it started.
"""

from __future__ import annotations

from dataclasses import dataclass

from azure.data.tables import TableClient
from azure.storage.blob import ContainerClient

from .settings import Settings


@dataclass(frozen=True)
class JobStores:
    """The tiles container (written through the gates only), the output container (the mosaic
    and its companions), the manifest table, the settings that give GDAL's limits, and GDAL
    configuration options every step adds to them (the activities give none: every byte GDAL
    reads comes through the app's pinned readers; a bench or a test may give its own)."""

    tiles: ContainerClient
    output: ContainerClient
    manifest: TableClient
    settings: Settings
    gdal_options: dict | None = None
