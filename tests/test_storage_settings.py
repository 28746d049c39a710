"""Connection and app settings: StorageConnection.from_env and Settings.from_env.

Nothing here calls Azure: clients and credentials are only constructed, never used (one test
calls Azurite, to show which connection the activities' clients come from).
"""

from __future__ import annotations

import http.client
import http.server
import threading
import uuid
from urllib.parse import urlsplit

import pytest
from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient

from tilecommit.errors import BadInputError, ConfigurationError
from tilecommit.settings import (
    DATA_CONNECTION,
    DEFAULT_BATCH_SIZE,
    DEFAULT_WINDOW_SIZE,
    SETTING_ASSEMBLY_SHARE,
    SETTING_BATCH_SIZE,
    SETTING_GDAL_CACHEMAX,
    SETTING_MANIFEST_TABLE,
    SETTING_MAX_PIXELS,
    SETTING_TILES_CONTAINER,
    SETTING_WINDOW_SIZE,
    STORAGE_CONNECTION,
    TILES_CONTAINER,
    Settings,
)
from tilecommit.storage import StorageConnection, environment_options, parse_connection_string, vsiaz_path

AZURITE_STYLE = (
    "DefaultEndpointsProtocol=http;AccountName=devacct;AccountKey=a2V5a2V5a2V5a2V5==;"
    "BlobEndpoint=http://127.0.0.1:10000/devacct;QueueEndpoint=http://127.0.0.1:10001/devacct;"
    "TableEndpoint=http://127.0.0.1:10002/devacct/;"
)


# ----------------------------------------------------------------------------- connection strings


def test_connection_string_with_explicit_endpoints():
    conn = StorageConnection.from_env(environ={STORAGE_CONNECTION: AZURITE_STYLE})
    assert conn.connection_string == AZURITE_STYLE
    assert conn.blob_endpoint == "http://127.0.0.1:10000/devacct"
    assert conn.queue_endpoint == "http://127.0.0.1:10001/devacct"
    assert conn.table_endpoint == "http://127.0.0.1:10002/devacct"  # trailing slash dropped
    assert conn.account_name == "devacct"
    assert conn.client_id is None
    # The key keeps its base64 padding: only the first '=' splits a pair.
    assert parse_connection_string(AZURITE_STYLE)["AccountKey"] == "a2V5a2V5a2V5a2V5=="


def test_connection_string_with_account_name_only_builds_the_public_endpoints():
    value = "DefaultEndpointsProtocol=https;AccountName=prodacct;AccountKey=eHg=;EndpointSuffix=core.chinacloudapi.cn"
    conn = StorageConnection.from_env(environ={STORAGE_CONNECTION: value})
    assert conn.blob_endpoint == "https://prodacct.blob.core.chinacloudapi.cn"
    assert conn.table_endpoint == "https://prodacct.table.core.chinacloudapi.cn"
    assert conn.queue_endpoint == "https://prodacct.queue.core.chinacloudapi.cn"
    assert conn.account_name == "prodacct"


def test_sas_connection_string_without_account_name():
    value = "BlobEndpoint=https://sasacct.blob.core.windows.net/;SharedAccessSignature=sv=2023-11-03&sig=a%2Bb%3D"
    conn = StorageConnection.from_env(environ={STORAGE_CONNECTION: value})
    assert conn.blob_endpoint == "https://sasacct.blob.core.windows.net"
    assert conn.table_endpoint is None
    assert conn.account_name == "sasacct"
    assert parse_connection_string(value)["SharedAccessSignature"] == "sv=2023-11-03&sig=a%2Bb%3D"


def test_connection_string_wins_over_identity_settings():
    env = {
        STORAGE_CONNECTION: AZURITE_STYLE,
        f"{STORAGE_CONNECTION}__blobServiceUri": "https://other.blob.core.windows.net",
        f"{STORAGE_CONNECTION}__tableServiceUri": "https://other.table.core.windows.net",
    }
    assert StorageConnection.from_env(environ=env).blob_endpoint == "http://127.0.0.1:10000/devacct"


def test_reads_os_environ_by_default_and_other_connection_names(monkeypatch):
    monkeypatch.setenv("MyStorage", AZURITE_STYLE)
    monkeypatch.delenv(STORAGE_CONNECTION, raising=False)
    assert StorageConnection.from_env("MyStorage").account_name == "devacct"
    with pytest.raises(ConfigurationError):
        StorageConnection.from_env(environ={"MyStorage": AZURITE_STYLE})  # default name not set


@pytest.mark.parametrize(
    "value",
    ["garbage", "AccountName", "DefaultEndpointsProtocol=https;AccountKey=eHg=", "EndpointSuffix=core.windows.net"],
)
def test_unusable_connection_strings_are_configuration_errors(value):
    with pytest.raises(ConfigurationError):
        StorageConnection.from_env(environ={STORAGE_CONNECTION: value})


@pytest.mark.parametrize(
    "value",
    [
        "UseDevelopmentStorage=true",
        "usedevelopmentstorage=TRUE",
        " UseDevelopmentStorage = true ",
        "UseDevelopmentStorage=true;",
        "UseDevelopmentStorage=true;DevelopmentStorageProxyUri=http://127.0.0.1",
    ],
)
def test_use_development_storage_is_a_clear_configuration_error(value):
    with pytest.raises(ConfigurationError) as info:
        StorageConnection.from_env(environ={STORAGE_CONNECTION: value})
    message = str(info.value)
    assert "UseDevelopmentStorage" in message and STORAGE_CONNECTION in message
    assert "connection string" in message


# ----------------------------------------------------------------------------- identity-based


def test_identity_based_service_uris_with_user_assigned_identity():
    env = {
        f"{STORAGE_CONNECTION}__blobServiceUri": "https://prodacct.blob.core.windows.net/",
        f"{STORAGE_CONNECTION}__tableServiceUri": "https://prodacct.table.core.windows.net/",
        f"{STORAGE_CONNECTION}__queueServiceUri": "https://prodacct.queue.core.windows.net",
        f"{STORAGE_CONNECTION}__credential": "managedidentity",
        f"{STORAGE_CONNECTION}__clientId": " 11111111-2222-3333-4444-555555555555 ",
    }
    conn = StorageConnection.from_env(environ=env)
    assert conn.connection_string is None
    assert conn.blob_endpoint == "https://prodacct.blob.core.windows.net"
    assert conn.table_endpoint == "https://prodacct.table.core.windows.net"
    assert conn.queue_endpoint == "https://prodacct.queue.core.windows.net"
    assert conn.client_id == "11111111-2222-3333-4444-555555555555"
    assert conn.account_name == "prodacct"

    from azure.identity import ManagedIdentityCredential

    assert isinstance(conn.credential, ManagedIdentityCredential)  # constructed, never asked for a token
    blob = conn.blob_service()
    assert isinstance(blob, BlobServiceClient)
    assert blob.url.rstrip("/") == "https://prodacct.blob.core.windows.net"
    assert blob.credential is conn.credential
    table = conn.table_service()
    assert isinstance(table, TableServiceClient)
    assert table.url.rstrip("/") == "https://prodacct.table.core.windows.net"


def test_identity_based_system_assigned_uses_default_credential():
    env = {
        f"{STORAGE_CONNECTION}__blobServiceUri": "https://prodacct.blob.core.windows.net",
        f"{STORAGE_CONNECTION}__tableServiceUri": "https://prodacct.table.core.windows.net",
        f"{STORAGE_CONNECTION}__credential": "managedidentity",
    }
    conn = StorageConnection.from_env(environ=env)
    assert conn.client_id is None and conn.queue_endpoint is None

    from azure.identity import DefaultAzureCredential

    assert isinstance(conn.credential, DefaultAzureCredential)


def test_identity_based_account_name_builds_all_three_endpoints():
    env = {f"{STORAGE_CONNECTION}__accountName": "prodacct", f"{STORAGE_CONNECTION}__credential": "managedidentity"}
    conn = StorageConnection.from_env(environ=env)
    assert conn.blob_endpoint == "https://prodacct.blob.core.windows.net"
    assert conn.table_endpoint == "https://prodacct.table.core.windows.net"
    assert conn.queue_endpoint == "https://prodacct.queue.core.windows.net"
    assert conn.account_name == "prodacct"


def test_identity_based_explicit_uri_wins_over_account_name():
    env = {
        f"{STORAGE_CONNECTION}__accountName": "prodacct",
        f"{STORAGE_CONNECTION}__blobServiceUri": "https://custom.example.net/",
    }
    conn = StorageConnection.from_env(environ=env)
    assert conn.blob_endpoint == "https://custom.example.net"
    assert conn.table_endpoint == "https://prodacct.table.core.windows.net"


@pytest.mark.parametrize(
    "env",
    [
        {},
        {STORAGE_CONNECTION: "   "},
        {f"{STORAGE_CONNECTION}__credential": "managedidentity"},
        {f"{STORAGE_CONNECTION}__blobServiceUri": "https://prodacct.blob.core.windows.net"},  # no table
        {f"{STORAGE_CONNECTION}__tableServiceUri": "https://prodacct.table.core.windows.net"},  # no blob
    ],
    ids=["nothing", "blank", "credential-only", "blob-only", "table-only"],
)
def test_missing_connection_is_a_configuration_error_naming_the_settings(env):
    with pytest.raises(ConfigurationError) as info:
        StorageConnection.from_env(environ=env)
    assert isinstance(info.value, BadInputError)
    message = str(info.value)
    assert STORAGE_CONNECTION in message and "__blobServiceUri" in message and "__tableServiceUri" in message


def test_gdal_options_with_a_connection_string_need_no_token():
    conn = StorageConnection.from_connection_string(AZURITE_STYLE)
    assert conn.gdal_options() == {
        "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
        "AZURE_STORAGE_CONNECTION_STRING": AZURITE_STYLE,
    }
    assert vsiaz_path("raster-tiles", "tiles/0123456789abcdef/0000_0001.tif") == (
        "/vsiaz/raster-tiles/tiles/0123456789abcdef/0000_0001.tif"
    )


# ----------------------------------------------------------------------------- Settings.from_env


def test_settings_defaults_and_overrides():
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({}).window_size == DEFAULT_WINDOW_SIZE
    s = Settings.from_env(
        {
            SETTING_WINDOW_SIZE: " 512 ",
            SETTING_BATCH_SIZE: "16",
            SETTING_TILES_CONTAINER: "",
            SETTING_MANIFEST_TABLE: "m2",
        }
    )
    assert (s.window_size, s.batch_size, s.tiles_container, s.manifest_table) == (512, 16, TILES_CONTAINER, "m2")
    assert Settings.from_env({SETTING_BATCH_SIZE: ""}).batch_size == DEFAULT_BATCH_SIZE
    assert Settings.from_env({SETTING_ASSEMBLY_SHARE: "8"}).assembly_share_mb == 8


@pytest.mark.parametrize(
    "setting, value",
    [
        (SETTING_WINDOW_SIZE, "abc"),
        (SETTING_WINDOW_SIZE, "1024px"),
        (SETTING_WINDOW_SIZE, "1.5"),
        (SETTING_WINDOW_SIZE, "0"),
        (SETTING_WINDOW_SIZE, "-1024"),
        (SETTING_WINDOW_SIZE, "300"),
        (SETTING_WINDOW_SIZE, "1000"),
        (SETTING_BATCH_SIZE, "0"),
        (SETTING_BATCH_SIZE, "1001"),
        (SETTING_BATCH_SIZE, "many"),
        (SETTING_MAX_PIXELS, "0"),
        (SETTING_GDAL_CACHEMAX, "-1"),
        (SETTING_ASSEMBLY_SHARE, "0"),
        (SETTING_ASSEMBLY_SHARE, "2401"),
    ],
)
def test_bad_settings_are_configuration_errors_naming_the_setting(setting, value):
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({setting: value})
    assert setting in str(info.value)
    assert isinstance(info.value, ValueError)  # callers may treat it as plain bad input
    assert not info.value.retryable


def test_the_codes_connection_is_its_own_when_set_and_the_hosts_when_not():
    host = {STORAGE_CONNECTION: AZURITE_STYLE}
    assert StorageConnection.for_data(host).connection_string == AZURITE_STYLE
    own = {
        **host,
        f"{DATA_CONNECTION}__blobServiceUri": "http://127.0.0.1:10000/devacct",
        f"{DATA_CONNECTION}__tableServiceUri": "http://127.0.0.1:10002/devacct",
        f"{DATA_CONNECTION}__credential": "managedidentity",
        f"{DATA_CONNECTION}__clientId": "data-client",
    }
    code = StorageConnection.for_data(own)
    assert (code.connection_string, code.client_id) == (None, "data-client")
    assert StorageConnection.from_env(environ=own).connection_string == AZURITE_STYLE  # the host's is untouched
    with pytest.raises(ConfigurationError, match=DATA_CONNECTION):  # set, but not enough to connect
        StorageConnection.for_data({**host, f"{DATA_CONNECTION}__credential": "managedidentity"})
    # Another account than the host's: the activities would not find the uploads the trigger saw.
    elsewhere = {**own, f"{DATA_CONNECTION}__blobServiceUri": "https://data.blob.core.windows.net"}
    with pytest.raises(ConfigurationError, match="must name the same account"):
        StorageConnection.for_data(elsewhere)


def process_contexts() -> dict:
    from activities.context import activity_context
    from client_functions.context import client_context

    return {"activities": lambda: activity_context().stores, "client functions": client_context}


@pytest.mark.parametrize("part", ["activities", "client functions"])
def test_the_clients_of_each_part_come_from_the_codes_own_connection(azurite, monkeypatch, part):
    """The host's connection has a key Azurite refuses, the code's the right one: the part's
    stores answer, so they were made from the code's connection, not the host's."""
    parts = parse_connection_string(azurite.connection_string)
    wrong_key = azurite.connection_string.replace(parts["AccountKey"], "d3Jvbmcga2V5IGZvciB0aGUgaG9zdA==")
    assert wrong_key != azurite.connection_string
    monkeypatch.setenv(STORAGE_CONNECTION, wrong_key)
    monkeypatch.setenv(DATA_CONNECTION, azurite.connection_string)
    monkeypatch.setenv(SETTING_MANIFEST_TABLE, "manifestowndata")
    ctx = process_contexts()[part]()
    assert ctx.tiles.url.startswith(azurite.connection_string.split("BlobEndpoint=")[1].split(";")[0])
    ctx.tiles.exists()  # a signed request: the host's key would be refused (403)
    ctx.manifest.create_table()
    try:
        assert list(ctx.manifest.list_entities()) == []
    finally:
        ctx.manifest.delete_table()


# ----------------------------------------------------------------------------- the environment, read once


class _CountingProxy(http.server.BaseHTTPRequestHandler):
    """A plain-HTTP forward proxy on 127.0.0.1: counts what it forwards, as a corporate proxy
    would see it (the absolute URL of each request), and relays it to its origin."""

    seen: list[str] = []

    def _relay(self) -> None:
        type(self).seen.append(f"{self.command} {self.path}")
        target = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
        upstream.request(self.command, target.path + (f"?{target.query}" if target.query else ""), body, headers)
        answer = upstream.getresponse()
        payload = answer.read()
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        upstream.close()

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _relay

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def counting_proxy():
    _CountingProxy.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _CountingProxy.seen
    server.shutdown()
    server.server_close()


def test_the_environment_s_proxy_is_read_once_per_client_and_still_used(storage, counting_proxy, monkeypatch):
    """The clients no longer ask the environment on every request (environment_options), yet a
    proxy the environment names still carries their requests, and NO_PROXY still bypasses it."""
    proxy, seen = counting_proxy
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    blobs = storage.blob_service()
    assert blobs._config.transport is not None
    container = blobs.get_container_client(f"proxied{uuid.uuid4().hex[:12]}")
    container.create_container()
    container.upload_blob("a", b"through the proxy")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # changed after the client was made: not read again
    assert container.download_blob("a").readall() == b"through the proxy"
    assert any(line.startswith("PUT http://127.0.0.1:") for line in seen) and len(seen) >= 3, seen

    monkeypatch.setenv("HTTP_PROXY", proxy)
    before = len(seen)
    storage.table_service().create_table_if_not_exists(f"proxied{uuid.uuid4().hex[:12]}")
    assert len(seen) > before and seen[-1].startswith("POST http://127.0.0.1:"), seen  # the table client's too

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    before = len(seen)
    storage.table_service().create_table_if_not_exists("proxiedtable")
    assert len(seen) == before  # bypassed, as requests does with NO_PROXY
    assert "proxies" not in environment_options(storage.blob_endpoint)


def test_the_environment_s_ca_bundle_is_the_client_s_verify_setting(monkeypatch):
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    assert environment_options("https://acct.blob.core.windows.net")["connection_verify"] == (
        "/etc/ssl/certs/ca-certificates.crt"
    )
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert "connection_verify" not in environment_options("https://acct.blob.core.windows.net")


# ----------------------------------------------------------------------------- connections


def _transport(client):
    """The RequestsTransport under a storage client (through the SDKs' TransportWrapper, if any)."""
    transport = client._client._client._pipeline._transport  # the SDKs' generated client's pipeline
    while hasattr(transport, "_transport"):
        transport = transport._transport
    return transport


def test_each_client_keeps_the_sdks_transport_settings_with_a_larger_pool(storage, azurite):
    """The clients' session is the app's (a pool of STORAGE_CONNECTIONS), and the SDKs still build
    the transport: the app's timeouts and each SDK's own read size, the same as a client the SDK
    makes alone. A transport handed in instead would read 4 KiB at a time with azure-core's
    default timeouts."""
    from azure.storage.queue import QueueServiceClient

    from devhost.durable.queues import queue_service
    from tilecommit.retries import CONNECTION_TIMEOUT_S, READ_TIMEOUT_S
    from tilecommit.storage import STORAGE_CONNECTIONS

    plain = azurite.connection_string
    assert _transport(storage.blob_service()).connection_config.data_block_size > 4096
    for ours, sdks_own, app_timeouts in (
        (storage.blob_service(), BlobServiceClient.from_connection_string(plain), True),
        (storage.table_service(), TableServiceClient.from_connection_string(plain), True),
        (queue_service(storage), QueueServiceClient.from_connection_string(plain), False),
    ):
        transport = _transport(ours)
        assert transport.session is not None and not transport.session.trust_env
        adapter = transport.session.get_adapter("http://127.0.0.1")
        assert adapter._pool_maxsize == STORAGE_CONNECTIONS
        assert adapter.max_retries.total is False  # retries are the SDK's policy, not urllib3's
        config, default = transport.connection_config, _transport(sdks_own).connection_config
        assert config.data_block_size == default.data_block_size, type(ours).__name__
        if app_timeouts:
            assert (config.timeout, config.read_timeout) == (CONNECTION_TIMEOUT_S, READ_TIMEOUT_S)
        else:
            assert (config.timeout, config.read_timeout) == (default.timeout, default.read_timeout)


def test_a_client_shared_by_twenty_threads_reuses_its_connections(storage, caplog):
    """20 threads sending at once through one client, three rounds: no connection is discarded
    (requests' default pool of 10 discarded and reopened one for every sender past 10, each round)."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    blobs = storage.blob_service()
    container = blobs.get_container_client(f"pool{uuid.uuid4().hex[:12]}")
    container.create_container()
    blob = container.get_blob_client("b")
    blob.upload_blob(b"x" * 1024)
    gate = threading.Barrier(20)

    def send(_):
        gate.wait()
        return blob.get_blob_properties().size

    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    try:
        with ThreadPoolExecutor(20) as pool:
            for _ in range(3):
                assert list(pool.map(send, range(20))) == [1024] * 20
    finally:
        container.delete_container()
    messages = [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"]
    assert not [m for m in messages if "Connection pool is full" in m]
    opened = [m for m in messages if m.startswith("Starting new HTTP connection")]
    assert 1 <= len(opened) <= 21, len(opened)  # 20 senders, the container's own requests came first


def test_no_step_of_a_job_hands_gdal_a_storage_key_or_token(app_env, azurite, monkeypatch, tmp_path):
    """GDAL reads none of the app's storage (docs/faults.md), so no job step gives it the
    connection's key or the identity's token: every GDAL configuration a whole job sets is
    recorded (the one function that builds them) and none names storage credentials."""
    from testkit.storage_proxy import FaultPlan
    from tilecommit.raster import env

    from .app_jobs import check_outputs, make_scene
    from .fault_jobs import run_job

    seen: list[dict] = []
    original = env.gdal_config

    def recording(*args, **kwargs):
        config = original(*args, **kwargs)
        seen.append(config)
        return config

    monkeypatch.setattr(env, "gdal_config", recording)
    scene = make_scene(tmp_path / "scene.tif", 600, 520)
    summary, *_ = run_job(app_env, azurite, monkeypatch, scene, "creds.tif", FaultPlan(), timer_scale=0.01)
    check_outputs(StorageConnection.from_connection_string(azurite.connection_string), app_env, summary, scene)
    assert seen, "no GDAL configuration was recorded"
    leaked = {key for config in seen for key in config if key.startswith(("AZURE_STORAGE", "AZURE_SAS"))}
    assert leaked == set()
