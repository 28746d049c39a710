"""Every activity of the app is held to one contract as a whole, the decoding of its input
included: a retryable fault is raised (the orchestrator's retry policy repeats it), anything else
comes back as an error value and fails the job once.

An input the activity cannot read (a bug, or the payload of a release that named its fields
otherwise, still in a running job's history) is not a storage fault: it used to be raised, retried
six times over minutes, and reported as "storage stayed unavailable or throttled"."""

from __future__ import annotations

import json

import pytest

from activities.tiling import held_to_contract
from devhost.durable.functions import FunctionIndex
from orchestrators import names
from orchestrators.failures import FaultFailure, failure_for
from tilecommit.errors import FAULT, StorageFaultError

WINDOW = {"id": "0000_0000", "row": 0, "col": 0, "row_off": 0, "col_off": 0, "height": 256, "width": 256}


@pytest.fixture(scope="module")
def index() -> FunctionIndex:
    return FunctionIndex.load("function_app")


@pytest.mark.parametrize(
    ("activity", "payload"),
    [
        # A job of a release whose payload carried neither a spec nor a window size.
        (names.RENDER_TILE, {"job": {"job_id": "older", "blob": "a.tif"}, "window": WINDOW}),
        # A window without its offsets.
        (names.RENDER_TILE, {"job": {"job_id": "older", "window_size": 256}, "window": {"id": "0000_0000"}}),
        (names.VALIDATE_SOURCE, {"job_id": "older"}),
        (names.ASSEMBLE_MOSAIC, {"job": {"job_id": "older", "window_size": 256}, "scene": {"width": 1}}),
    ],
)
def test_an_input_the_activity_cannot_read_fails_the_job_once_as_a_fault(index, activity, payload, caplog):
    answer = json.loads(index.invoke_activity(activity, json.dumps(payload)))  # raises if it raised
    error = answer["error"]
    assert (error["kind"], error["type"]) == (FAULT, "UnreadableRecordError"), error
    assert "cannot be built from" in error["message"]
    failure = failure_for({"job_id": "older", "blob": "a.tif"}, error)
    assert isinstance(failure, FaultFailure) and "failed, not retryable" in str(failure)
    assert "storage stayed unavailable" not in str(failure)
    assert any("failed for good" in r.getMessage() and "job older" in r.getMessage() for r in caplog.records)


def test_a_retryable_fault_still_reaches_the_retry_policy_and_a_value_passes_unchanged():
    def busy(payload: dict) -> dict:
        raise StorageFaultError("503 ServerBusy")

    with pytest.raises(StorageFaultError, match="ServerBusy"):
        held_to_contract("render_tile", busy)({"job": {"job_id": "j"}})
    value = {"error": {"kind": "bad_input", "type": "InvalidRasterError", "message": "m", "window": None}}
    assert held_to_contract("render_tile", lambda payload: value)({"job": {"job_id": "j"}}) is value
