"""How busy the activity slots were, from the host's execution records."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Timed(Protocol):
    started: float
    seconds: float


def max_overlap(executions: Iterable[Timed]) -> int:
    """The most executions that ran at the same moment."""
    edges = sorted(
        [(e.started, 1) for e in executions] + [(e.started + e.seconds, -1) for e in executions],
        key=lambda edge: (edge[0], edge[1]),
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def slot_use(executions: Iterable[Timed], slots: int) -> float:
    """Busy slot-seconds over the slot-seconds available from the first start to the last end."""
    items = list(executions)
    if not items:
        return 0.0
    span = max(e.started + e.seconds for e in items) - min(e.started for e in items)
    return sum(e.seconds for e in items) / (slots * span) if span > 0 else 1.0
