"""Storage clients from the app's connection settings, for the SDK and for GDAL's ``/vsiaz/``.

The host and Durable use ``AzureWebJobsStorage``; the code uses ``TilecommitData`` when it is set
and the host's connection when not (:meth:`StorageConnection.for_data`). Each is spelled either way:
- locally, a connection string (Azurite's is spelled out in ``local.settings.example.json``);
- in Azure, identity-based: ``<name>__blobServiceUri`` / ``__tableServiceUri`` /
  ``__queueServiceUri`` (or ``<name>__accountName``) with ``<name>__credential=managedidentity``
  and optionally ``<name>__clientId`` for a user-assigned identity. No keys in app settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar
from urllib.parse import urlsplit

from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobClient, BlobProperties, BlobServiceClient

from . import retries, usage
from .errors import ConfigurationError, InvalidNameError
from .settings import DATA_CONNECTION, STORAGE_CONNECTION
from .storage_answers import unless_missing


def blob_head(blob: BlobClient) -> BlobProperties | None:
    """One HEAD: the blob's properties, or None when there is no blob; anything else storage
    answers (or does not) is a storage fault (:func:`~tilecommit.storage_answers.unless_missing`)."""
    return unless_missing("reading the properties of", blob.blob_name, blob.get_blob_properties)


#: The scope of a token for Azure Storage (blobs, tables and queues).
STORAGE_TOKEN_SCOPE = "https://storage.azure.com/.default"


def parse_connection_string(value: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for item in value.split(";"):
        item = item.strip()
        if not item:
            continue
        key, sep, val = item.partition("=")
        if not sep:
            raise ConfigurationError(f"malformed storage connection string near {key!r}")
        parts[key.strip()] = val.strip()
    return parts


def configures(environ: Mapping[str, str], name: str) -> bool:
    """Whether ``environ`` sets connection ``name``, as a string or as ``name__...`` settings."""
    return any(key == name or key.startswith(f"{name}__") for key in environ)


def environment_options(endpoint: str | None) -> dict[str, Any]:
    """The client options that stand for what ``requests`` reads from the environment, read once.

    ``requests`` looks up the proxy variables (``HTTPS_PROXY``, ``NO_PROXY``...) and the CA bundle
    (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``) again on every request when its session trusts
    the environment, as azure-core's transport has it by default: about 0.3 ms of CPU a request,
    about 0.6 CPU-s of a 10240² job's 1,900 requests (py-spy). A client speaks to one endpoint,
    so the answer is the same every time: it is taken here, for the endpoint, and the session no
    longer consults the environment (azure-core's ``use_env_settings=False``). That also keeps a
    ``~/.netrc`` entry for the storage host from replacing the SDK's own Authorization header,
    which ``requests`` does for a session that trusts the environment.
    """
    from requests.utils import get_environ_proxies

    options: dict[str, Any] = {"use_env_settings": False}
    proxies = {scheme: url for scheme, url in get_environ_proxies(endpoint or "").items() if scheme != "no"}
    if proxies:
        options["proxies"] = proxies
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        options["connection_verify"] = bundle
    return options


#: Connections a storage client keeps open to its endpoint. ``requests`` keeps 10 by default, and
#: one client serves every thread of a worker: 4 activity slots, and the assembly's 8 copy and 8
#: fetch threads. Past 10, each extra connection was closed after its request and opened again,
#: with urllib3's WARNING "Connection pool is full, discarding connection": on Azure, a new TCP
#: and TLS handshake for that request.
STORAGE_CONNECTIONS = 32


def pooled_session(connections: int = STORAGE_CONNECTIONS) -> Any:
    """A ``requests`` session for one storage client, keeping ``connections`` open.

    It is given to the client as its ``session`` option, not inside a transport: the storage SDKs
    then still build the transport themselves with their timeouts and their read size (256 KiB
    for blobs). A transport handed in gets neither: responses were then read 4 KiB at a time,
    about three times the CPU for a 6 MiB GET. The adapter is the one azure-core mounts on a session of its own
    (``RequestsTransport._init_session``, azure-core 1.41): urllib3 retries nothing, the SDK's
    retry policy does, with a larger pool. azure-core's subclass of it only sets a send block
    size in ``get_connection``, which requests 2.32 and later no longer call. The session does not
    read the environment: :func:`environment_options` has done that once.
    """
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    session = requests.Session()
    session.trust_env = False
    adapter = HTTPAdapter(
        pool_maxsize=connections, max_retries=Retry(total=False, redirect=False, raise_on_status=False)
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


#: The two kinds of service client a connection builds.
_Client = TypeVar("_Client", BlobServiceClient, TableServiceClient)


def _endpoint(endpoint: str | None, service: str) -> str:
    """A service's endpoint for the identity's clients; ``from_env`` always sets both."""
    if not endpoint:
        raise ConfigurationError(f"no {service} endpoint: a connection without a connection string needs one")
    return endpoint


@dataclass(frozen=True)
class StorageConnection:
    """Where storage is and how to authenticate to it."""

    connection_string: str | None = None
    blob_endpoint: str | None = None
    table_endpoint: str | None = None
    queue_endpoint: str | None = None
    client_id: str | None = None

    @classmethod
    def from_env(cls, name: str = STORAGE_CONNECTION, environ: Mapping[str, str] | None = None) -> StorageConnection:
        env = os.environ if environ is None else environ
        value = (env.get(name) or "").strip()
        if value:
            # Also with a trailing ';' or a DevelopmentStorageProxyUri after it.
            flags = {k.lower(): v.lower() for k, v in parse_connection_string(value).items()}
            if flags.get("usedevelopmentstorage") == "true":
                raise ConfigurationError(
                    f"{name}=UseDevelopmentStorage=true is a host shorthand the storage SDKs used here do "
                    "not expand: give Azurite's full connection string (see local.settings.example.json)"
                )
            return cls.from_connection_string(value)
        account = (env.get(f"{name}__accountName") or "").strip()
        blob = (env.get(f"{name}__blobServiceUri") or env.get(f"{name}__serviceUri") or "").strip()
        table = (env.get(f"{name}__tableServiceUri") or "").strip()
        queue = (env.get(f"{name}__queueServiceUri") or "").strip()
        if account:
            blob = blob or f"https://{account}.blob.core.windows.net"
            table = table or f"https://{account}.table.core.windows.net"
            queue = queue or f"https://{account}.queue.core.windows.net"
        if not blob or not table:
            raise ConfigurationError(
                f"no storage connection: set {name} (a connection string) or {name}__blobServiceUri and "
                f"{name}__tableServiceUri (or {name}__accountName) with {name}__credential=managedidentity"
            )
        return cls(
            blob_endpoint=blob.rstrip("/"),
            table_endpoint=table.rstrip("/"),
            queue_endpoint=queue.rstrip("/") or None,
            client_id=(env.get(f"{name}__clientId") or "").strip() or None,
        )

    @classmethod
    def for_data(cls, environ: Mapping[str, str] | None = None) -> StorageConnection:
        """The connection the code reads and writes its data with: ``TilecommitData`` when any
        setting of it is there, else the host's (one identity for both, as on a laptop).

        Both must name the same blob endpoint: the blob trigger hands the starter the upload
        through the host's connection, and the activities read it by name through this one.
        """
        env = os.environ if environ is None else environ
        if not configures(env, DATA_CONNECTION):
            return cls.from_env(STORAGE_CONNECTION, env)
        data = cls.from_env(DATA_CONNECTION, env)
        if configures(env, STORAGE_CONNECTION):
            host = cls.from_env(STORAGE_CONNECTION, env)
            if host.blob_endpoint != data.blob_endpoint:
                raise ConfigurationError(
                    f"{DATA_CONNECTION} names {data.blob_endpoint} and {STORAGE_CONNECTION} {host.blob_endpoint}: "
                    f"they must name the same account (the blob trigger reads uploads through {STORAGE_CONNECTION}); "
                    f"unset {DATA_CONNECTION} to use {STORAGE_CONNECTION} for both"
                )
        return data

    @classmethod
    def from_connection_string(cls, value: str) -> StorageConnection:
        parts = parse_connection_string(value)
        account = parts.get("AccountName")
        protocol = parts.get("DefaultEndpointsProtocol", "https")
        suffix = parts.get("EndpointSuffix", "core.windows.net")

        def endpoint(key: str, service: str) -> str | None:
            if parts.get(key):
                return parts[key].rstrip("/")
            return f"{protocol}://{account}.{service}.{suffix}" if account else None

        blob = endpoint("BlobEndpoint", "blob")
        if not blob:
            raise ConfigurationError("storage connection string has neither AccountName nor BlobEndpoint")
        return cls(
            connection_string=value,
            blob_endpoint=blob,
            table_endpoint=endpoint("TableEndpoint", "table"),
            queue_endpoint=endpoint("QueueEndpoint", "queue"),
        )

    @property
    def account_name(self) -> str:
        if self.connection_string:
            name = parse_connection_string(self.connection_string).get("AccountName")
            if name:
                return name
        host = urlsplit(self.blob_endpoint or "").hostname or ""
        return host.split(".")[0]

    @cached_property
    def credential(self) -> Any:
        """The managed identity (or the developer's login) when no connection string is given."""
        from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

        if self.client_id:
            return ManagedIdentityCredential(client_id=self.client_id)
        return DefaultAzureCredential()

    def blob_service(self, **kwargs: Any) -> BlobServiceClient:
        """A blob client with the retry policy and timeouts of :mod:`tilecommit.retries`, whose
        requests count toward the running activity's usage (:mod:`tilecommit.usage`); ``kwargs`` win."""
        return self._service(BlobServiceClient, "blob", self.blob_endpoint, retries.blob_client_options(), kwargs)

    def table_service(self, **kwargs: Any) -> TableServiceClient:
        """A table client with the retry settings and timeouts of :mod:`tilecommit.retries`, counted
        as :meth:`blob_service`'s; ``kwargs`` win."""
        return self._service(TableServiceClient, "table", self.table_endpoint, retries.table_client_options(), kwargs)

    def _service(
        self, client_class: type[_Client], kind: str, endpoint: str | None, options: dict, kwargs: dict
    ) -> _Client:
        kwargs = {
            **options,
            **environment_options(endpoint),
            "session": pooled_session(),
            "raw_response_hook": usage.response_hook(kind),
            **kwargs,
        }
        if self.connection_string:
            return client_class.from_connection_string(self.connection_string, **kwargs)
        return client_class(_endpoint(endpoint, kind), credential=self.credential, **kwargs)

    def gdal_options(self) -> dict[str, str]:
        """GDAL configuration for reading ``/vsiaz/{container}/{blob}`` with these settings.

        Not for the app: GDAL reads none of its storage (every read goes through the app's own
        reader, pinned and counted: docs/faults.md), so no function puts a key or a token into
        GDAL's configuration. The benches use it to let ``rio cogeo`` read a blob the way GDAL
        does, and the tests to show that a GDAL able to reach storage still reads nothing of it.

        With a connection string GDAL reads it directly (``BlobEndpoint=`` points it at Azurite);
        with an identity, a short-lived bearer token is fetched with azure-identity, since GDAL
        does not speak the Functions managed-identity endpoint itself.
        """
        options = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR"}
        if self.connection_string:
            options["AZURE_STORAGE_CONNECTION_STRING"] = self.connection_string
        else:
            token = self.credential.get_token(STORAGE_TOKEN_SCOPE)
            options["AZURE_STORAGE_ACCOUNT"] = self.account_name
            options["AZURE_STORAGE_ACCESS_TOKEN"] = token.token
        return options


def readable_blob_name(blob_name: str) -> str:
    """``blob_name`` unchanged when it addresses one blob of its container in a request path.

    A blob name is data from outside. GDAL and the SDK send the path's segments as they are, and
    the HTTP layer below them resolves ``.`` and ``..`` segments (RFC 3986), so ``a/../../other/b``
    would address another container: such names are refused, as are backslashes.
    """
    segments = blob_name.split("/")
    if any(segment in (".", "..") for segment in segments) or "\\" in blob_name:
        raise InvalidNameError(
            f"blob name {blob_name!r} has a '.' or '..' segment or a backslash: it cannot be read as one "
            "blob of its container; rename it"
        )
    return blob_name


def vsiaz_path(container: str, blob_name: str) -> str:
    """The GDAL path of a blob: ``/vsiaz/{container}/{blob}`` (its name checked by :func:`readable_blob_name`)."""
    return f"/vsiaz/{container}/{readable_blob_name(blob_name)}"
