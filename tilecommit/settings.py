"""Names and settings shared by the code, the local host and the Bicep templates.

Every container, table and app-setting name the app relies on is defined here once;
``tests/test_infra_agreement.py`` reads ``infra/`` and fails when the templates disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import profiles
from .catalog import naming as collections
from .errors import ConfigurationError
from .retries import ASSEMBLY_SHARE_MB

#: The host's connection (app-setting prefix): the Functions host, Durable and the blob trigger.
#: Locally a connection string; in Azure identity-based (``AzureWebJobsStorage__blobServiceUri`` ...).
STORAGE_CONNECTION = "AzureWebJobsStorage"
#: The code's own connection, to the uploads, tiles, mosaics and manifest, when it is set (in
#: Azure: the same account with an identity of its own, whose roles cannot reach the host's
#: containers, docs/security.md); when it is not (locally), the code uses the host's.
DATA_CONNECTION = "TilecommitData"

#: Where users upload rasters; the blob trigger watches it.
INPUT_CONTAINER = "raster-uploads"
#: Where the per-window COG tiles go (``tiles/{job_id}/{row:04d}_{col:04d}.tif``).
TILES_CONTAINER = "raster-tiles"
#: Where the assembled mosaic, its STAC item and quicklook go.
OUTPUT_CONTAINER = "raster-mosaics"
#: The create-only manifest: PartitionKey job id, RowKey window id.
MANIFEST_TABLE = "tilemanifest"
#: Where Event Grid writes the BlobCreated events it could not deliver (infra; replayed with
#: ``python -m devhost replay-dead-letters``). The app itself never reads it.
DEAD_LETTER_CONTAINER = "eventgrid-deadletter"

#: The Durable task hub name (host.json ``extensions.durableTask.hubName``).
TASK_HUB = "TileCommitHub"
#: Name of the blob-triggered starter function; the Event Grid subscription targets it.
TRIGGER_FUNCTION = "raster_uploaded"

#: App settings the code reads, with their defaults.
SETTING_INPUT_CONTAINER = "TILECOMMIT_INPUT_CONTAINER"
SETTING_TILES_CONTAINER = "TILECOMMIT_TILES_CONTAINER"
SETTING_OUTPUT_CONTAINER = "TILECOMMIT_OUTPUT_CONTAINER"
SETTING_MANIFEST_TABLE = "TILECOMMIT_MANIFEST_TABLE"
SETTING_WINDOW_SIZE = "TILECOMMIT_WINDOW_SIZE"
SETTING_BATCH_SIZE = "TILECOMMIT_BATCH_SIZE"
SETTING_MAX_PIXELS = "TILECOMMIT_MAX_PIXELS"
SETTING_GDAL_CACHEMAX = "TILECOMMIT_GDAL_CACHEMAX_MB"
SETTING_ASSEMBLY_SHARE = "TILECOMMIT_ASSEMBLY_SHARE_MB"
#: The Event Grid topic the completion events go to (its endpoint URL); empty: no events.
SETTING_EVENTS_ENDPOINT = "TILECOMMIT_EVENTS_ENDPOINT"
#: A key for that endpoint, for the local host's stand-in topic only; in Azure the app's identity.
SETTING_EVENTS_KEY = "TILECOMMIT_EVENTS_KEY"
#: The instance's memory, in MB (the plan's instance size), for each job's compute estimate.
SETTING_INSTANCE_MEMORY_MB = "TILECOMMIT_INSTANCE_MEMORY_MB"
#: Days a finished job's tiles, manifest rows and Durable history are kept; 0: kept forever.
SETTING_TILE_RETENTION_DAYS = "TILECOMMIT_TILE_RETENTION_DAYS"
#: The output profile of uploads that name none and match no rule (tilecommit/profiles.py):
#: ``name[,level=N][,predictor=N]``.
SETTING_PROFILE = "TILECOMMIT_PROFILE"
#: Profiles by upload path: ``prefix=profile[,key=value...];...``, the longest prefix first.
SETTING_PROFILE_RULES = "TILECOMMIT_PROFILE_RULES"
#: The collection of uploads that name none and match no rule (tilecommit/catalog/naming.py).
SETTING_COLLECTION = "TILECOMMIT_COLLECTION"
#: Collections by upload path: ``prefix=collection;...``, the longest prefix first.
SETTING_COLLECTION_RULES = "TILECOMMIT_COLLECTION_RULES"
#: The pgstac database each finished job's STAC item is published to (docs/catalog.md). Its host
#: empty or unset: no publication (the embedded default needs no database).
SETTING_PGSTAC_HOST = "TILECOMMIT_PGSTAC_HOST"
SETTING_PGSTAC_PORT = "TILECOMMIT_PGSTAC_PORT"
SETTING_PGSTAC_DATABASE = "TILECOMMIT_PGSTAC_DATABASE"
SETTING_PGSTAC_USER = "TILECOMMIT_PGSTAC_USER"
#: How the app signs in to it: ``entra`` (a Microsoft Entra token of the app's data identity as
#: the password, TLS required) or ``trust`` (a local cluster that trusts 127.0.0.1). Never a password.
SETTING_PGSTAC_AUTH = "TILECOMMIT_PGSTAC_AUTH"
#: The STAC API's base URL, for each item's catalog link; empty: the link is the item's blob URL.
SETTING_STAC_API_URL = "TILECOMMIT_STAC_API_URL"

APP_SETTINGS = (
    SETTING_INPUT_CONTAINER,
    SETTING_TILES_CONTAINER,
    SETTING_OUTPUT_CONTAINER,
    SETTING_MANIFEST_TABLE,
    SETTING_WINDOW_SIZE,
    SETTING_BATCH_SIZE,
    SETTING_MAX_PIXELS,
    SETTING_GDAL_CACHEMAX,
    SETTING_ASSEMBLY_SHARE,
    SETTING_EVENTS_ENDPOINT,
    SETTING_TILE_RETENTION_DAYS,
    SETTING_INSTANCE_MEMORY_MB,
    SETTING_PROFILE,
    SETTING_PROFILE_RULES,
    SETTING_COLLECTION,
    SETTING_COLLECTION_RULES,
)

#: The catalog's settings (the publication to pgstac and the STAC API's URL): deployed only where a
#: catalog is deployed; unset, the app publishes nowhere.
CATALOG_SETTINGS = (
    SETTING_PGSTAC_HOST,
    SETTING_PGSTAC_PORT,
    SETTING_PGSTAC_DATABASE,
    SETTING_PGSTAC_USER,
    SETTING_PGSTAC_AUTH,
    SETTING_STAC_API_URL,
)
PGSTAC_AUTH_ENTRA = "entra"
PGSTAC_AUTH_TRUST = "trust"
DEFAULT_PGSTAC_PORT = 5432
#: pgstac's own name for its database (pypgstac's and stac-fastapi-pgstac's examples use it).
DEFAULT_PGSTAC_DATABASE = "pgstac"
#: The token scope of Azure Database for PostgreSQL's Microsoft Entra authentication.
PGSTAC_ENTRA_SCOPE = "https://ossrdbms-aad.database.windows.net/.default"

#: 1024 px windows: 0.17-0.21 s and ~115 MB a worker for 3-band uint16 (docs/design.md, 'GDAL settings and raster figures').
DEFAULT_WINDOW_SIZE = 1024
#: Windows per sub-orchestration: bounds each instance's history, whose replay cost grows with its length
#: (docs/design.md, 'Durable Functions without the host').
DEFAULT_BATCH_SIZE = 64
#: 40960 x 40960 pixels; larger scenes are refused before any tile is written.
DEFAULT_MAX_PIXELS = 40960 * 40960
#: GDAL block cache per process, in MB (the tuned value: docs/design.md, 'GDAL settings and raster figures').
DEFAULT_GDAL_CACHEMAX_MB = 64
#: MiB of tiles one activity stages into the mosaic by the service's copy; a job whose tiles hold
#: more stages them in shares of this size, one activity each, then commits once (the budget:
#: tilecommit/retries.py, ASSEMBLY_SHARE_MB).
DEFAULT_ASSEMBLY_SHARE_MB = ASSEMBLY_SHARE_MB
#: Tiles are intermediate: the mosaic holds their pixels. A week leaves time to verify, repair
#: or retry a job from its tiles before they go (docs/operations.md, "Retention").
DEFAULT_TILE_RETENTION_DAYS = 7
#: Flex Consumption's default instance size (infra/main.bicep, instanceMemoryMB).
DEFAULT_INSTANCE_MEMORY_MB = 2048
#: Linux Consumption's instance memory, the smallest the app runs on: past it the platform recycles
#: the instance. The upload budgets (raster/reading/budgets.py) are derived from it, the local host
#: recycles itself past it, and the benches measure against it.
CONSUMPTION_INSTANCE_MB = 1536

#: Names of sidecar files: companions GDAL would read beside a raster (metadata, overviews,
#: masks, world files, projection files). The app never reads them with a raster, and an upload
#: with such a name starts no job (it is logged and ignored). Whether any other upload is a
#: raster is decided by its content, never its name (tilecommit/raster/reading/upload.py).
SIDECAR_SUFFIXES = (
    ".aux.xml",
    ".aux",
    ".ovr",
    ".msk",
    ".tfw",
    ".tifw",
    ".tiffw",
    ".j2w",
    ".jp2w",
    ".wld",
    ".prj",
    ".tab",
    ".imd",
    ".rpb",
    "_rpc.txt",
    ".xml",
)


@dataclass(frozen=True)
class Settings:
    """The app's configuration as a plain object with defaults (read from app settings)."""

    input_container: str = INPUT_CONTAINER
    tiles_container: str = TILES_CONTAINER
    output_container: str = OUTPUT_CONTAINER
    manifest_table: str = MANIFEST_TABLE
    window_size: int = DEFAULT_WINDOW_SIZE
    batch_size: int = DEFAULT_BATCH_SIZE
    max_pixels: int = DEFAULT_MAX_PIXELS
    gdal_cachemax_mb: int = DEFAULT_GDAL_CACHEMAX_MB
    assembly_share_mb: int = DEFAULT_ASSEMBLY_SHARE_MB
    events_endpoint: str = ""
    tile_retention_days: int = DEFAULT_TILE_RETENTION_DAYS
    instance_memory_mb: int = DEFAULT_INSTANCE_MEMORY_MB
    profile: str = profiles.DEFAULT
    profile_rules: str = ""
    collection: str = collections.DEFAULT_COLLECTION
    collection_rules: str = ""
    pgstac_host: str = ""
    pgstac_port: int = DEFAULT_PGSTAC_PORT
    pgstac_database: str = DEFAULT_PGSTAC_DATABASE
    pgstac_user: str = ""
    pgstac_auth: str = PGSTAC_AUTH_ENTRA
    stac_api_url: str = ""

    def __post_init__(self) -> None:
        # Refused here, at start, when malformed.
        choices = [(SETTING_PROFILE, self.default_profile())]
        choices += [(f"{SETTING_PROFILE_RULES} rule {prefix!r}", c) for prefix, c in self.profile_rule_list()]
        collections.check_collection_id(self.collection, where=SETTING_COLLECTION, error=ConfigurationError)
        self.collection_rule_list()
        if self.window_size <= 0 or self.window_size % 256:
            raise ConfigurationError(
                f"{SETTING_WINDOW_SIZE}={self.window_size}: the window size must be a positive "
                "multiple of 256 (the mosaic's internal block size)"
            )
        for where, choice in choices:
            block_size = int(choice.option("blocksize") or profiles.DEFAULT_BLOCK_SIZE)
            if self.window_size % block_size:
                raise ConfigurationError(
                    f"{where}: blocksize={block_size} with {SETTING_WINDOW_SIZE}={self.window_size}: the window "
                    "size must be a multiple of the block size"
                )
        if not 1 <= self.batch_size <= 1000:
            raise ConfigurationError(f"{SETTING_BATCH_SIZE}={self.batch_size}: expected 1..1000")
        if self.max_pixels <= 0:
            raise ConfigurationError(f"{SETTING_MAX_PIXELS}={self.max_pixels}: expected > 0")
        if self.gdal_cachemax_mb <= 0:
            raise ConfigurationError(f"{SETTING_GDAL_CACHEMAX}={self.gdal_cachemax_mb}: expected > 0")
        if self.events_endpoint and not self.events_endpoint.startswith(("https://", "http://127.0.0.1:")):
            raise ConfigurationError(
                f"{SETTING_EVENTS_ENDPOINT}={self.events_endpoint!r}: expected the topic's https:// endpoint "
                "(or the local host's http://127.0.0.1: stand-in)"
            )
        if self.instance_memory_mb <= 0:
            raise ConfigurationError(f"{SETTING_INSTANCE_MEMORY_MB}={self.instance_memory_mb}: expected MB > 0")
        if self.tile_retention_days < 0:
            raise ConfigurationError(
                f"{SETTING_TILE_RETENTION_DAYS}={self.tile_retention_days}: expected days >= 0 (0: keep forever)"
            )
        if not 1 <= self.assembly_share_mb <= DEFAULT_ASSEMBLY_SHARE_MB:
            raise ConfigurationError(
                f"{SETTING_ASSEMBLY_SHARE}={self.assembly_share_mb}: expected 1..{DEFAULT_ASSEMBLY_SHARE_MB} "
                "(more would not fit one function's time at the slowest copy rate planned for)"
            )
        if self.pgstac_auth not in (PGSTAC_AUTH_ENTRA, PGSTAC_AUTH_TRUST):
            raise ConfigurationError(
                f"{SETTING_PGSTAC_AUTH}={self.pgstac_auth!r}: expected {PGSTAC_AUTH_ENTRA} or {PGSTAC_AUTH_TRUST}"
            )
        if self.pgstac_host and not self.pgstac_user:
            raise ConfigurationError(f"{SETTING_PGSTAC_HOST} is set: {SETTING_PGSTAC_USER} must name the role")
        if self.stac_api_url and not self.stac_api_url.startswith(("https://", "http://127.0.0.1:")):
            raise ConfigurationError(f"{SETTING_STAC_API_URL}={self.stac_api_url!r}: expected an https:// URL")

    @property
    def publishes(self) -> bool:
        """Whether finished jobs are published to pgstac."""
        return bool(self.pgstac_host)

    def default_profile(self) -> profiles.Choice:
        return profiles.parse(self.profile, where=SETTING_PROFILE, error=ConfigurationError)

    def profile_rule_list(self) -> list[tuple[str, profiles.Choice]]:
        return profiles.parse_rules(self.profile_rules, where=SETTING_PROFILE_RULES)

    def collection_rule_list(self) -> list[tuple[str, str]]:
        return collections.parse_rules(self.collection_rules, where=SETTING_COLLECTION_RULES)

    def collection_for(self, blob_name: str, metadata: Mapping[str, str] | None) -> str:
        """The collection an upload joins (tilecommit/catalog/naming.py); raises
        :class:`~tilecommit.errors.BadInputError` for metadata naming no valid id."""
        return collections.resolve(metadata, blob_name, rules=self.collection_rule_list(), default=self.collection)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def integer(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return int(raw)
            except ValueError:
                raise ConfigurationError(f"{name}={raw!r}: expected a whole number") from None

        return cls(
            input_container=env.get(SETTING_INPUT_CONTAINER) or INPUT_CONTAINER,
            tiles_container=env.get(SETTING_TILES_CONTAINER) or TILES_CONTAINER,
            output_container=env.get(SETTING_OUTPUT_CONTAINER) or OUTPUT_CONTAINER,
            manifest_table=env.get(SETTING_MANIFEST_TABLE) or MANIFEST_TABLE,
            window_size=integer(SETTING_WINDOW_SIZE, DEFAULT_WINDOW_SIZE),
            batch_size=integer(SETTING_BATCH_SIZE, DEFAULT_BATCH_SIZE),
            max_pixels=integer(SETTING_MAX_PIXELS, DEFAULT_MAX_PIXELS),
            gdal_cachemax_mb=integer(SETTING_GDAL_CACHEMAX, DEFAULT_GDAL_CACHEMAX_MB),
            assembly_share_mb=integer(SETTING_ASSEMBLY_SHARE, DEFAULT_ASSEMBLY_SHARE_MB),
            events_endpoint=env.get(SETTING_EVENTS_ENDPOINT, "").strip(),
            tile_retention_days=integer(SETTING_TILE_RETENTION_DAYS, DEFAULT_TILE_RETENTION_DAYS),
            instance_memory_mb=integer(SETTING_INSTANCE_MEMORY_MB, DEFAULT_INSTANCE_MEMORY_MB),
            profile=env.get(SETTING_PROFILE, "").strip() or profiles.DEFAULT,
            profile_rules=env.get(SETTING_PROFILE_RULES, "").strip(),
            collection=env.get(SETTING_COLLECTION, "").strip() or collections.DEFAULT_COLLECTION,
            collection_rules=env.get(SETTING_COLLECTION_RULES, "").strip(),
            pgstac_host=env.get(SETTING_PGSTAC_HOST, "").strip(),
            pgstac_port=integer(SETTING_PGSTAC_PORT, DEFAULT_PGSTAC_PORT),
            pgstac_database=env.get(SETTING_PGSTAC_DATABASE, "").strip() or DEFAULT_PGSTAC_DATABASE,
            pgstac_user=env.get(SETTING_PGSTAC_USER, "").strip(),
            pgstac_auth=env.get(SETTING_PGSTAC_AUTH, "").strip() or PGSTAC_AUTH_ENTRA,
            stac_api_url=env.get(SETTING_STAC_API_URL, "").strip().rstrip("/"),
        )


def connection_fingerprint(environ: Mapping[str, str] | None = None) -> str:
    """The settings of the host's and the code's connections, as one string: a process keeps the
    clients it built for them until this changes (activities/context.py, client_functions/context.py)."""
    env = os.environ if environ is None else environ
    prefixes = (STORAGE_CONNECTION, DATA_CONNECTION)
    return "|".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(prefixes))
