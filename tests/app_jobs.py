"""Helpers for tests that run whole jobs on the local host: each test's own app settings
(containers, tables, task hub), a host to run them, and reading back what a job stored."""

from __future__ import annotations

from dataclasses import dataclass

from devhost.host import HostOptions, LocalHost

#: Window size of the end-to-end tests: small scenes still make several windows.
WINDOW = 256


@dataclass
class AppEnv:
    hub: str
    input: str
    tiles: str
    output: str
    manifest: str
    env: dict


def local_host(app_env: AppEnv, **options) -> LocalHost:
    options = {"timer_scale": 0.01, "watch_interval": 0.1, **options}
    return LocalHost(HostOptions(hub=app_env.hub, **options))


def download(storage, container: str, name: str) -> bytes:
    return storage.blob_service().get_blob_client(container, name).download_blob().readall()
