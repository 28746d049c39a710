"""Time budgets from one setting: every wait of the app fits host.json's functionTimeout, and the
orchestrator's patience outlasts the storage outage the app is meant to survive.

Fails when host.json's timeout and ``tilecommit.retries.FUNCTION_TIMEOUT_S`` disagree, when a
storage call's worst case (retries and one hung request) exceeds its share of the function's
time, or when the clients, GDAL and the orchestrator are not configured with these values.
"""

from __future__ import annotations

import json
import re

from orchestrators.retries import ACTIVITY_RETRY_OPTIONS
from tests.bicep import REPO_ROOT
from tilecommit import retries
from tilecommit.raster.env import gdal_config
from tilecommit.settings import Settings
from tilecommit.storage import StorageConnection


def host_json_timeout_s() -> int:
    hours, minutes, seconds = re.fullmatch(
        r"(\d+):(\d+):(\d+)", json.loads((REPO_ROOT / "host.json").read_text())["functionTimeout"]
    ).groups()
    return int(hours) * 3600 + int(minutes) * 60 + int(seconds)


WORST_CALLS = {
    "blob client": retries.worst_call_s(
        retries.blob_sleeps(retries.BLOB_RETRIES), retries.CONNECTION_TIMEOUT_S + retries.READ_TIMEOUT_S
    ),
    "table client": retries.worst_call_s(
        retries.table_sleeps(retries.TABLE_RETRIES), retries.CONNECTION_TIMEOUT_S + retries.READ_TIMEOUT_S
    ),
    "GDAL /vsiaz/": retries.worst_call_s(
        retries.gdal_sleeps(retries.GDAL_RETRIES), retries.GDAL_CONNECT_TIMEOUT_S + retries.GDAL_HTTP_TIMEOUT_S
    ),
}


def test_the_one_setting_is_host_json_function_timeout():
    assert host_json_timeout_s() == retries.FUNCTION_TIMEOUT_S


def test_every_storage_call_and_one_activity_attempt_fit_the_function_timeout():
    print(f"\nbudget per call {retries.CALL_BUDGET_S:.1f} s; worst cases {WORST_CALLS}")
    for layer, worst in WORST_CALLS.items():
        assert worst <= retries.CALL_BUDGET_S, (layer, worst)
    attempt = retries.ACTIVITY_SERIAL_CALLS * max(WORST_CALLS.values())
    assert attempt <= retries.FUNCTION_TIMEOUT_S * retries.RETRY_SHARE < retries.FUNCTION_TIMEOUT_S
    # Each layer still retries: the budget is not so small that a throttled request fails at once.
    assert min(retries.BLOB_RETRIES, retries.TABLE_RETRIES, retries.GDAL_RETRIES) >= 2


def test_a_shorter_timeout_buys_fewer_retries_never_a_worst_case_over_budget():
    for budget in (10, 20, 30, 60, 120):
        for sleeps, timeout in (
            (retries.blob_sleeps, retries.CONNECTION_TIMEOUT_S + retries.READ_TIMEOUT_S),
            (retries.gdal_sleeps, retries.GDAL_CONNECT_TIMEOUT_S + retries.GDAL_HTTP_TIMEOUT_S),
        ):
            n = retries.most_retries(sleeps, timeout, budget)
            assert n == 0 or retries.worst_call_s(sleeps(n), timeout) <= budget
            assert retries.worst_call_s(sleeps(n + 1), timeout) > budget


def test_the_orchestrator_outlasts_a_one_minute_outage_with_backoff():
    policy = retries.ACTIVITY_RETRY
    waits = policy.waits()
    assert waits == sorted(waits) and max(waits) == policy.max_interval_s
    assert policy.patience_s() > retries.OUTAGE_SURVIVED_S
    assert ACTIVITY_RETRY_OPTIONS.to_json() == {
        "firstRetryIntervalInMilliseconds": int(policy.first_interval_s * 1000),
        "maxNumberOfAttempts": policy.max_attempts,
        "backoffCoefficient": policy.backoff_coefficient,
        "maxRetryIntervalInMilliseconds": int(policy.max_interval_s * 1000),
    }


def test_clients_and_gdal_are_built_with_these_values():
    connection = StorageConnection.from_connection_string(
        "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/a;"
        "TableEndpoint=http://127.0.0.1:2/a"
    )
    blob_policy = connection.blob_service()._config.retry_policy
    assert (blob_policy.total_retries, blob_policy.initial_backoff, blob_policy.increment_base) == (
        retries.BLOB_RETRIES,
        retries.BLOB_INITIAL_BACKOFF_S,
        retries.BLOB_INCREMENT_BASE,
    )
    table_policy = connection.table_service()._client._client._pipeline._impl_policies
    retry = next(p for p in table_policy if type(p).__name__ == "TablesRetryPolicy")
    assert (retry.total_retries, retry.backoff_factor, retry.backoff_max) == (
        retries.TABLE_RETRIES,
        retries.TABLE_BACKOFF_FACTOR_S,
        retries.TABLE_BACKOFF_MAX_S,
    )
    config = gdal_config(Settings())
    assert config["GDAL_HTTP_MAX_RETRY"] == str(retries.GDAL_RETRIES)
    assert config["GDAL_HTTP_TIMEOUT"] == str(retries.GDAL_HTTP_TIMEOUT_S)
