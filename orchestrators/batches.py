"""One fan-out over a scene's windows, shared by the job (render) and the scrub (verify): the
window plan in batches, each batch a sub-orchestration running one activity per window, every
batch started at once, and above :data:`GROUP_BATCHES` batches a level of groups between.

What differs between the two is a :class:`WindowWork`: the names of its orchestrators and
activity, what each batch is handed, how a batch sums its windows' results. Deterministic: the
plan is a pure function of the scene size and the job's own sizes (never the app settings).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import azure.durable_functions as df

from tilecommit.grid import Window, plan_windows
from tilecommit.jobs import Job

from .calls import activity_task, fan_out

#: Above this many batches, batches are grouped under group sub-orchestrations, so the parent's
#: own history grows with the number of groups, not with the scene: every instance replays at
#: most ~GROUP_BATCHES children (measured: one flat level of 157 batches made the parent's
#: replay grow quadratically, 0.06 s -> 4.7 s from 1,000 to 10,000 windows).
GROUP_BATCHES = 16


@dataclass(frozen=True)
class WindowWork:
    """One kind of work over every window of a scene."""

    #: The orchestrators of one batch and of one group of batches, and the activity of one window.
    batch: str
    group: str
    activity: str
    #: Keys of the orchestration's input that every batch, and each window's activity, is handed.
    shared: tuple[str, ...]
    #: A batch's summary of its windows' results (with ``batches`` 1), and an empty one to add to.
    summarise: Callable[[list[dict]], dict]
    empty: Callable[[], dict]
    add: Callable[[dict, dict], None]
    #: The key of a group's input that carries the instance id naming its batches; None: the
    #: job's id names them.
    parent_key: str | None = None


def batch_instance_id(parent: str, index: int) -> str:
    """Deterministic sub-orchestration id (no '/', '\\', '#', '?'; at most 256 characters)."""
    return f"{parent}-batch-{index:05d}"


def group_instance_id(parent: str, index: int) -> str:
    return f"{parent}-group-{index:04d}"


def chunk(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def plan_batches(job: dict, scene: dict) -> list[list[Window]]:
    """The job's windows in batches: a pure function of the scene size and the job's sizes."""
    record = Job.from_dict(job)
    return chunk(plan_windows(scene["width"], scene["height"], record.spec.window_size), record.batch_size)


def batch_children(parent: str, shared: dict, batches: list[list[Window]], indices: range) -> list[tuple[str, dict]]:
    return [(batch_instance_id(parent, i), {**shared, "windows": [w.to_dict() for w in batches[i]]}) for i in indices]


def over_windows(
    context: df.DurableOrchestrationContext,
    work: WindowWork,
    request: dict,
    parent: str,
    scene: dict,
    batches: list[list[Window]],
    on_done: Callable[[dict], None],
) -> Generator[Any, Any, None]:
    """Run every batch of ``batches`` (named after ``parent``), handing each batch's or group's
    summary to ``on_done`` as it lands; ``request``: the orchestration's input."""
    shared = {key: request[key] for key in work.shared}
    if len(batches) <= GROUP_BATCHES:
        yield from fan_out(context, work.batch, batch_children(parent, shared, batches, range(len(batches))), on_done)
        return
    head = {**shared, work.parent_key: parent} if work.parent_key else shared
    children = [
        (
            group_instance_id(parent, g),
            {
                **head,
                "scene": {"width": scene["width"], "height": scene["height"]},
                "first_batch": first,
                "batch_count": min(GROUP_BATCHES, len(batches) - first),
            },
        )
        for g, first in enumerate(range(0, len(batches), GROUP_BATCHES))
    ]
    yield from fan_out(context, work.group, children, on_done)


def run_group(context: df.DurableOrchestrationContext, work: WindowWork) -> Generator[Any, Any, dict]:
    """A group of consecutive batches (large scenes): their batches as sub-orchestrations; their sum."""
    group: dict = context.get_input()
    parent = group[work.parent_key] if work.parent_key else group["job"]["job_id"]
    batches = plan_batches(group["job"], group["scene"])
    first, count = group["first_batch"], group["batch_count"]
    children = batch_children(parent, {key: group[key] for key in work.shared}, batches, range(first, first + count))
    total = work.empty()
    yield from fan_out(context, work.batch, children, lambda summary: work.add(total, summary))
    return total


def run_batch(context: df.DurableOrchestrationContext, work: WindowWork) -> Generator[Any, Any, dict]:
    """One batch of windows: one activity per window, all at once; their summary."""
    batch: dict = context.get_input()
    shared = {key: batch[key] for key in work.shared}
    tasks = [activity_task(context, work.activity, {**shared, "window": window}) for window in batch["windows"]]
    results = yield context.task_all(tasks)
    return work.summarise(results)
