"""Episodes: for longer than the SDK's own retries last, every request of one operation the job
sends gets the answer a throttled account gives (tests/test_seeded_storage_faults.py runs them and
checks every job; the long run there has an episode for each kind of write and each answer)."""

from __future__ import annotations

import pytest

from testkit import storage_ops as ops
from testkit.storage_proxy import BUSY, CANNOT_VERIFY

from .test_seeded_storage_faults import run_episode

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("operation", "answer"),
    [(ops.PUT_BLOCK_FROM_URL, CANNOT_VERIFY), (ops.INSERT_ENTITY, BUSY)],
    ids=["copy-source-throttled", "manifest-partition-throttled"],
)
def test_an_episode_longer_than_the_sdks_retries_costs_time_not_the_job(
    storage, app_env, azurite, monkeypatch, tmp_path, operation, answer
):
    figures = run_episode(storage, app_env, azurite, monkeypatch, tmp_path, operation, answer)
    # The job outlasted the episode: it waited for storage, it did not fail.
    assert figures["slowest_job_s"] >= 30, figures
