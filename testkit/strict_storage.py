"""Azurite held to Azure's rules: the storage every test runs against.

:class:`StrictStorage` puts a :class:`~testkit.storage_proxy.RecordingProxy` with
:class:`~testkit.azure_rules.AzureRules` in front of an Azurite's blob and table endpoints and
answers for it with the same attributes (:attr:`connection_string`, :attr:`blob_port`...), so a
test, the app and the local host under test (in the test's process or in processes it starts)
reach storage only through the rules, and meet Azure's refusals where Azurite would have accepted.
The queue endpoint is Azurite's own: the queue rules the local host meets (64 KiB a message)
Azurite enforces itself.

Rules only, no injected fault: the fault tests put a :class:`~testkit.storage_proxy.FaultProxy`
in front of these ports.
"""

from __future__ import annotations

from .azure_rules import AzureRules
from .storage_proxy import RecordingProxy


class StrictStorage:
    """Proxies holding ``emulator`` (a started ``devhost.azurite.Azurite``, or anything with its
    ports, account and key) to Azure's rules.

    Use as a context manager; it stops the proxies, not the emulator. The proxies stay up across
    the emulator's outages (:meth:`outage` and :meth:`start` are the emulator's), as an account's
    front end outlives a storage node.
    """

    def __init__(self, emulator):
        self.emulator = emulator
        self.rules = AzureRules()
        self._blob = RecordingProxy(f"http://127.0.0.1:{emulator.blob_port}", self.rules, self._blob_exists)
        self._table = RecordingProxy(f"http://127.0.0.1:{emulator.table_port}", self.rules)
        # Nothing reads their request logs: recording every request of a session costs memory.
        self._blob.requests = self._table.requests = _Discard()
        self._blob.sent = self._table.sent = _Discard()
        self._blob.carried_out = self._table.carried_out = _Discard()

    def _blob_exists(self, container: str, blob: str) -> bool:
        """Whether ``container``/``blob`` exists, asked of the emulator itself (past the proxy)."""
        from azure.storage.blob import BlobClient

        direct = f"http://127.0.0.1:{self.emulator.blob_port}/{self.account}"
        credential = {"account_name": self.account, "account_key": self.key}
        return BlobClient(direct, container, blob, credential=credential).exists()

    # The attributes of an Azurite, through the proxies.
    @property
    def account(self) -> str:
        return self.emulator.account

    @property
    def key(self) -> str:
        return self.emulator.key

    @property
    def blob_port(self) -> int:
        return self._blob.port

    @property
    def table_port(self) -> int:
        return self._table.port

    @property
    def queue_port(self) -> int:
        return self.emulator.queue_port

    @property
    def blob_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.blob_port}/{self.account}"

    @property
    def table_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.table_port}/{self.account}"

    @property
    def queue_endpoint(self) -> str:
        return self.emulator.queue_endpoint

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.blob_endpoint};QueueEndpoint={self.queue_endpoint};"
            f"TableEndpoint={self.table_endpoint};"
        )

    @property
    def refused(self) -> list[tuple[str, str, str]]:
        """(operation, path, error code) of every request refused under the rules."""
        return self._blob.refused + self._table.refused

    def outage(self, *args) -> None:
        self.emulator.outage(*args)

    def start(self, *args, **kwargs) -> StrictStorage:
        self.emulator.start(*args, **kwargs)
        return self

    def __enter__(self) -> StrictStorage:
        self._blob.start()
        self._table.start()
        return self

    def __exit__(self, *exc) -> None:
        self._blob.stop()
        self._table.stop()


class _Discard(list):
    """A list that keeps nothing appended to it."""

    def append(self, item) -> None:
        pass
