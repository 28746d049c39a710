"""Hand-built Durable history JSON, shaped like the extension's, for orchestrator unit tests."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from devhost.durable.history import flatten_actions

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


class History:
    """Append events episode by episode; ``context(...)`` is what the host sends the worker."""

    def __init__(self, name: str, input_value: Any, instance_id: str = "job"):
        self.instance_id = instance_id
        self.input = json.dumps(input_value)
        self.events: list[dict] = []
        self.clock = _T0
        self.started(name)

    def _add(self, kind: int, event_id: int = -1, **fields: Any) -> History:
        self.clock += timedelta(milliseconds=10)
        stamp = self.clock.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.events.append({"EventType": kind, "EventId": event_id, "IsPlayed": False, "Timestamp": stamp, **fields})
        return self

    def started(self, name: str) -> History:
        self._add(12)
        return self._add(0, Name=name, Input=self.input, Version="")

    def episode(self) -> History:
        """Close the previous episode and open a new one."""
        self._add(13)
        for event in self.events:
            event["IsPlayed"] = True
        return self._add(12)

    def scheduled(self, event_id: int, name: str) -> History:
        return self._add(4, event_id, Name=name)

    def completed(self, event_id: int, result: Any) -> History:
        return self._add(5, TaskScheduledId=event_id, Result=json.dumps(result))

    def failed(self, event_id: int, reason: str) -> History:
        return self._add(6, TaskScheduledId=event_id, Reason=reason, Details="Traceback ...")

    def sub_created(self, event_id: int, name: str, instance_id: str) -> History:
        return self._add(7, event_id, Name=name, InstanceId=instance_id)

    def sub_completed(self, event_id: int, result: Any) -> History:
        return self._add(8, TaskScheduledId=event_id, Result=json.dumps(result))

    def sub_failed(self, event_id: int, reason: str) -> History:
        return self._add(9, TaskScheduledId=event_id, Reason=reason, Details="Traceback ...")

    def timer_created(self, event_id: int) -> History:
        return self._add(10, event_id, FireAt=self.clock.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))

    def timer_fired(self, timer_id: int) -> History:
        return self._add(11, TimerId=timer_id, FireAt=self.clock.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))

    def context(self) -> str:
        return json.dumps(
            {
                "history": self.events,
                "instanceId": self.instance_id,
                "isReplaying": False,
                "parentInstanceId": None,
                "input": self.input,
                "upperSchemaVersion": 1,
                "upperSchemaVersionNew": 2,
            }
        )


def leaf_actions(state: dict) -> list[dict]:
    """The orchestrator's actions as leaves, compound (when_all/when_any) ones opened."""
    return flatten_actions(state["actions"])
