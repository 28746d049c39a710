"""Small records that travel as JSON: activity results, orchestration payloads, log fields.

A record is a dataclass that also subclasses :class:`Record`. ``to_dict`` is
:func:`dataclasses.asdict` (so the JSON shape is the field list, in order) and ``from_dict``
builds the record back from a dict, ignoring keys it does not know (a result written by a newer
version still reads) and leaving missing optional fields to their defaults. Where JSON cannot
carry a value as it is (a NaN nodata), or a value must be normalised on the way in, the record
names a converter per field in ``JSON_OUT`` / ``JSON_IN``.

Durable Functions stores these dicts in the orchestration history, so a record's shape is part
of the stored state: renaming or reordering a field changes what a replay reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self, TypeVar

from .errors import TileCommitError, UnreadableRecordError

Converter = Callable[[Any], Any]
T = TypeVar("T")


class Record:
    """Mixin for a dataclass that is sent and stored as a plain JSON object."""

    #: Per-field converters applied by :meth:`to_dict` after ``asdict``.
    JSON_OUT: ClassVar[Mapping[str, Converter]] = {}
    #: Per-field converters applied by :meth:`from_dict` to the values present in the dict.
    JSON_IN: ClassVar[Mapping[str, Converter]] = {}

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)  # type: ignore[call-overload]  # a mixin: every user is a dataclass
        for name, convert in self.JSON_OUT.items():
            data[name] = convert(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return from_dict(cls, data, cls.JSON_IN)


def from_dict(cls: type[T], data: Mapping[str, Any], converters: Mapping[str, Converter] | None = None) -> T:
    """An instance of the dataclass ``cls`` from ``data``: unknown keys ignored, ``converters`` applied.

    What cannot be built (a required field missing, a converter refusing a value, ``data`` not a
    mapping) raises :class:`~tilecommit.errors.UnreadableRecordError`, naming the record and the
    keys it was given: the same JSON fails the same way, so no retry is spent on it.
    """
    converters = converters or {}
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]  # ``cls`` is a dataclass
    try:
        return cls(**{k: converters[k](v) if k in converters else v for k, v in data.items() if k in names})
    except TileCommitError:
        raise  # a record's own check (a name refused, say) says what is wrong itself
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise unreadable(cls, data, exc) from exc


def unreadable(cls: type, data: Any, exc: Exception) -> UnreadableRecordError:
    """The error of a ``cls`` that ``data`` cannot make (see :func:`from_dict`)."""
    given = sorted(data) if isinstance(data, Mapping) else type(data).__name__
    return UnreadableRecordError(f"{cls.__name__} cannot be built from {given}: {exc}")
