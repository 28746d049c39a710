"""The backfill orchestration: the blobs already stored under a prefix, page by page, each started
as a job exactly as its upload event would start it (client_functions/backfill.py), at most
``max_running`` of its jobs running at once.

One execution handles (part of) one page, then ``continue_as_new`` carries the state
(tilecommit/backfill.py) to the next, so the history never holds more than one execution's
events however many blobs: at most a count of the running jobs, one listing, one survey and
one start (four activities, two events each), one timer (two), the execution's start and end
and two events per episode for at most six episodes: 24 events, and four more for each retry
of an activity after a fault (docs/pipeline.md).
"""

from __future__ import annotations

from collections.abc import Generator
from datetime import timedelta
from typing import Any

import azure.durable_functions as df

from tilecommit.backfill import progress, tally

from . import names
from .calls import activity_task

#: What the survey says of a blob that a start may begin: a job not there yet, a failed one.
STARTABLE = ("new", "failed")


def backfill(context: df.DurableOrchestrationContext) -> Generator[Any, Any, dict]:
    """One step of a backfill: count its running jobs, list the page, survey and start what fits."""
    state: dict = context.get_input()
    report(context, state, "counting")
    if state["running"]:
        state["running"] = yield activity_task(context, names.COUNT_RUNNING_JOBS, {"job_ids": state["running"]})
    if not state["dry_run"] and len(state["running"]) >= state["max_running"]:
        return (yield from wait_for_room(context, state))
    report(context, state, "listing")
    page = yield activity_task(context, names.LIST_BACKFILL_PAGE, listing(state))
    remaining = unhandled(page["blobs"], state["after"])
    if remaining:
        report(context, state, "starting")
        survey = yield activity_task(context, names.SURVEY_BACKFILL_BLOBS, {**listing(state), "blobs": remaining})
        chosen = survey if state["dry_run"] else within_room(survey, state["max_running"] - len(state["running"]))
        if state["dry_run"]:
            for entry in chosen:
                tally(state, "started" if entry["kind"] == "new" else dry_count(entry), entry["blob"], entry["reason"])
        elif chosen:
            started = yield activity_task(context, names.START_BACKFILL_JOBS, {**listing(state), "entries": chosen})
            for outcome in started:
                tally(state, outcome["counted"], outcome["blob"], outcome["reason"])
                if outcome["counted"] in ("started", "resumed"):
                    state["running"].append(outcome["job_id"])
        state["counts"]["listed"] += len(chosen)
        if chosen:
            state["after"] = chosen[-1]["blob"]
        if len(chosen) < len(remaining):
            return (yield from wait_for_room(context, state))
    if page["next"] is None:
        report(context, state, "done")
        return summary(state)
    state.update(token=page["next"], after=None, pages=state["pages"] + 1)
    report(context, state, "listing")
    context.continue_as_new(state)
    return summary(state)


def listing(state: dict) -> dict:
    return {key: state[key] for key in ("container", "prefix", "token", "page_size")}


def unhandled(blobs: list[str], after: str | None) -> list[str]:
    """The page's blobs after ``after``, the last one a step before handled: by position while it
    is still listed, else by name (the listing's order is the names' code-point order in Azure)."""
    if after is None:
        return blobs
    if after in blobs:
        return blobs[blobs.index(after) + 1 :]
    return [blob for blob in blobs if blob > after]


def within_room(survey: list[dict], room: int) -> list[dict]:
    """The longest head of the page whose startable blobs fit in ``room`` more running jobs
    (a blob that starts nothing never waits)."""
    chosen = []
    for entry in survey:
        if entry["kind"] in STARTABLE:
            if room == 0:
                break
            room -= 1
        chosen.append(entry)
    return chosen


def dry_count(entry: dict) -> str:
    """What a dry run counts for a blob the survey found: what a start would do with it."""
    return {"failed": "resumed", "exists": "duplicates", "refused": "refused", "ignored": "ignored"}[entry["kind"]]


def wait_for_room(context: df.DurableOrchestrationContext, state: dict) -> Generator[Any, Any, dict]:
    """Wait ``wait_s`` on a durable timer, then go on as a new execution, which counts again."""
    report(context, state, "waiting for room")
    yield context.create_timer(context.current_utc_datetime + timedelta(seconds=state["wait_s"]))
    context.continue_as_new(state)
    return summary(state)


def report(context: df.DurableOrchestrationContext, state: dict, stage: str) -> None:
    """The custom status: the state (the progress a caller reads, and the checkpoint a re-run
    resumes from after a failure or a cancel), the running jobs counted."""
    state["stage"] = stage
    context.set_custom_status(progress(state))


def summary(state: dict) -> dict:
    return {
        key: state[key] for key in ("container", "prefix", "dry_run", "pages", "counts", "running", "failures", "stage")
    }
