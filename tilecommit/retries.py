"""How long the app waits for storage, in one place, derived from host.json's ``functionTimeout``.

Three layers retry a storage fault, each sized here (pure arithmetic, no I/O):

1. Inside one storage call: the SDK clients' retry policies (:func:`blob_client_options`,
   :func:`table_client_options`) and GDAL's HTTP retries for ``/vsiaz/`` reads
   (:func:`gdal_http_options`). All of them run inside an activity, so their worst case times
   the serial storage calls of one activity must fit the function's timeout: each call gets
   :data:`CALL_BUDGET_S`, and each layer takes as many retries as fit in it.
2. Across activity attempts: the orchestrator's retry policy (``orchestrators/retries.py``),
   which waits with durable timers outside any function, so its patience is not bounded by the
   timeout. It is sized so that a storage outage or throttling episode of :data:`OUTAGE_SURVIVED_S`
   costs time and never fails the job.
3. Nothing else waits: the mosaic takes no claim and waits for no other assembler.

``tests/test_retries.py`` fails when host.json's timeout and :data:`FUNCTION_TIMEOUT_S` disagree
or when any worst case below would not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

#: host.json ``functionTimeout`` (Consumption's maximum), in seconds.
FUNCTION_TIMEOUT_S = 600
#: Storage calls one activity attempt makes one after the other, at most (render_tile: the source's
#: properties, the manifest point read, GDAL's open and window read, the tile's put, the manifest
#: row; assembly makes more but each of its tile reads is a call of the same budget in a pool).
ACTIVITY_SERIAL_CALLS = 6
#: Share of the function's time storage retries may take, the rest being the work itself.
RETRY_SHARE = 0.5
#: What one storage call may cost at worst, every retry and one hung request included.
CALL_BUDGET_S = FUNCTION_TIMEOUT_S * RETRY_SHARE / ACTIVITY_SERIAL_CALLS

#: The longest storage outage or throttling episode a job survives (it costs time, not the job).
OUTAGE_SURVIVED_S = 60

# -- The mosaic's server-side copy --------------------------------------------------------------
#: The slowest rate the storage service's Put Block From URL is planned to copy at for one
#: activity: Azurite's on the 2-core bench machine under load (9 MB/s at 10240², 8 requests in
#: flight: docs/benchmarks.md). Azure documents no rate for it.
SLOWEST_COPY_BYTES_PER_S = 8 * 2**20
#: What one activity may copy through the service: at the slowest rate, the share of the
#: function's time that is not left to storage retries (2400 MiB). A mosaic whose tiles hold
#: more is staged in shares of at most this many bytes, each its own activity
#: (tilecommit/raster/assembly/shares.py); the default of TILECOMMIT_ASSEMBLY_SHARE_MB.
ASSEMBLY_SHARE_MB = int(FUNCTION_TIMEOUT_S * (1 - RETRY_SHARE) * SLOWEST_COPY_BYTES_PER_S) // 2**20

# -- A shared document's read-modify-write --------------------------------------------------
#: A document several jobs change (a collection's, tilecommit/catalog/collections.py) is read,
#: changed and written with If-Match on the version read; a 412 means another writer's version
#: landed in between, and the change is made again on the newer one. Each refusal costs one read
#: and one write; between them the writer sleeps a random time up to a cap that doubles from
#: the first (full jitter, so writers that collided do not collide again in step).
DOCUMENT_FIRST_BACKOFF_S = 0.02
DOCUMENT_MAX_BACKOFF_S = 1.0
#: Conditional writes of one document one activity attempt makes before it gives up (raising a
#: retryable fault, so the orchestrator's retry policy waits and the activity tries again), and
#: the time they may take: one storage call's budget, so the activity fits the function's timeout.
DOCUMENT_WRITE_ATTEMPTS = 100
DOCUMENT_WRITE_BUDGET_S = CALL_BUDGET_S

# -- SDK clients -----------------------------------------------------------------------------
#: Seconds to open a connection, and to wait for the next bytes of an answer (per request).
CONNECTION_TIMEOUT_S = 5
READ_TIMEOUT_S = 20
#: azure-storage-blob's ExponentialRetry sleeps ``initial + base ** n`` (n = 1, 2, ...) +- jitter.
BLOB_INITIAL_BACKOFF_S = 1
BLOB_INCREMENT_BASE = 2
BLOB_JITTER_S = 1
#: azure-data-tables (azure-core's RetryPolicy) sleeps ``factor * 2 ** (n - 1)`` from the second
#: retry on, at most ``max``, or what the answer's Retry-After says.
TABLE_BACKOFF_FACTOR_S = 1.0
TABLE_BACKOFF_MAX_S = 10

# -- GDAL ------------------------------------------------------------------------------------
#: GDAL's first retry delay; each next one is about 2 to 2.5 times the previous (GDAL 3.10,
#: ``CPLHTTPGetNewRetryDelay`` in ``port/cpl_http.cpp``; measured 0.5 s then 1.1-1.2 s).
GDAL_RETRY_DELAY_S = 1
GDAL_DELAY_GROWTH = 2.5
#: Seconds GDAL waits for a connection, and for a whole request.
GDAL_CONNECT_TIMEOUT_S = 5
GDAL_HTTP_TIMEOUT_S = 20


def blob_sleeps(retries: int) -> list[float]:
    """The blob client's longest sleeps before each of ``retries`` retries."""
    return [BLOB_INITIAL_BACKOFF_S + BLOB_INCREMENT_BASE**n + BLOB_JITTER_S for n in range(1, retries + 1)]


def table_sleeps(retries: int) -> list[float]:
    return [0.0] + [min(TABLE_BACKOFF_FACTOR_S * 2 ** (n - 1), TABLE_BACKOFF_MAX_S) for n in range(1, retries)]


def gdal_sleeps(retries: int) -> list[float]:
    return [GDAL_RETRY_DELAY_S * GDAL_DELAY_GROWTH**n for n in range(retries)]


def worst_call_s(sleeps: list[float], request_timeout_s: float) -> float:
    """One call's worst case: every retry's sleep, and one request that hangs until its timeout
    (requests refused at once, as in an outage or under throttling, cost their sleeps only)."""
    return sum(sleeps) + request_timeout_s


def most_retries(sleeps, request_timeout_s: float, budget_s: float = CALL_BUDGET_S) -> int:
    """The most retries whose worst case fits ``budget_s`` (``sleeps(n)`` gives their sleeps)."""
    n = 0
    while worst_call_s(sleeps(n + 1), request_timeout_s) <= budget_s:
        n += 1
    return n


BLOB_RETRIES = most_retries(blob_sleeps, CONNECTION_TIMEOUT_S + READ_TIMEOUT_S)
TABLE_RETRIES = most_retries(table_sleeps, CONNECTION_TIMEOUT_S + READ_TIMEOUT_S)
GDAL_RETRIES = most_retries(gdal_sleeps, GDAL_CONNECT_TIMEOUT_S + GDAL_HTTP_TIMEOUT_S)


@dataclass(frozen=True)
class ActivityRetry:
    """The orchestrator's retry policy for activities (Durable's RetryOptions fields)."""

    first_interval_s: float = 5
    backoff_coefficient: float = 2.0
    max_interval_s: float = 60
    max_attempts: int = 6

    def waits(self) -> list[float]:
        """The timers between attempts: first, first * coefficient, ..., capped at the max."""
        return [
            min(self.first_interval_s * self.backoff_coefficient**n, self.max_interval_s)
            for n in range(self.max_attempts - 1)
        ]

    def patience_s(self) -> float:
        """From the first attempt's failure to the start of the last: what an outage must outlast
        to fail the job even when every attempt fails at once."""
        return sum(self.waits())


ACTIVITY_RETRY = ActivityRetry()


def blob_client_options() -> dict:
    """Keyword arguments for ``BlobServiceClient`` (retry policy and timeouts)."""
    from azure.storage.blob import ExponentialRetry

    return {
        "retry_policy": ExponentialRetry(
            initial_backoff=BLOB_INITIAL_BACKOFF_S,
            increment_base=BLOB_INCREMENT_BASE,
            retry_total=BLOB_RETRIES,
            random_jitter_range=BLOB_JITTER_S,
        ),
        "connection_timeout": CONNECTION_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
    }


def table_client_options() -> dict:
    """Keyword arguments for ``TableServiceClient`` (azure-core retry settings and timeouts)."""
    return {
        "retry_total": TABLE_RETRIES,
        # azure-core counts retries after an error status, a refused connection and a failed
        # read apart too, each at most 3 unless set (RetryPolicyBase): without these a GET
        # answered 500 four times ended after 3 retries, not TABLE_RETRIES.
        "retry_status": TABLE_RETRIES,
        "retry_connect": TABLE_RETRIES,
        "retry_read": TABLE_RETRIES,
        "retry_backoff_factor": TABLE_BACKOFF_FACTOR_S,
        "retry_backoff_max": TABLE_BACKOFF_MAX_S,
        "connection_timeout": CONNECTION_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
    }


def gdal_http_options() -> dict[str, str]:
    """GDAL's HTTP settings for ``/vsiaz/`` reads: retries (GDAL retries 429, 500, 502, 503, 504
    and transport errors such as a reset connection) and timeouts."""
    return {
        "GDAL_HTTP_MAX_RETRY": str(GDAL_RETRIES),
        "GDAL_HTTP_RETRY_DELAY": str(GDAL_RETRY_DELAY_S),
        "GDAL_HTTP_CONNECTTIMEOUT": str(GDAL_CONNECT_TIMEOUT_S),
        "GDAL_HTTP_TIMEOUT": str(GDAL_HTTP_TIMEOUT_S),
    }
