"""Orchestration versions, as the Durable extension and DurableTask.Core handle them.

- Every new instance is stamped with a version when it is created: the one ``start_new`` or the
  parent's sub-orchestration action gives, else the host's ``defaultVersion`` (host.json
  ``extensions.durableTask.defaultVersion``). The stamp is the ExecutionStarted event's
  ``Version``, which the SDK reads back as ``context.version``; it never changes afterwards, on
  whichever host the instance runs. A sub-orchestration given no version gets the default
  version of the host that starts it, not its parent's.
- Before it runs an episode, a host compares the instance's version with its own default version
  (``versionMatchStrategy``): ``None`` runs everything, ``Strict`` only its own version,
  ``CurrentOrOlder`` its own and older ones. An instance it may not run is, by
  ``versionFailureStrategy``, left as it is for another host (``Reject``: DTFx abandons the work
  item, which comes back later) or failed (``Fail``).
- Versions compare as DTFx's ``VersioningSettings.CompareVersions``: empty equals empty and is
  older than anything else; two versions that both parse as .NET's ``System.Version`` (two to
  four dot-separated numbers) compare by their numbers; anything else by its text, ignoring case.
  So ``"10"`` is older than ``"9"`` (one number alone is not a ``System.Version``), while
  ``"10.0"`` is newer than ``"9.0"``.

Sources: DurableTask.Core ``src/DurableTask.Core/Settings/VersioningSettings.cs`` (the strategies,
their defaults, ``CompareVersions``) and ``src/DurableTask.Core/TaskOrchestrationDispatcher.cs``
(the check before an episode; ``AbandonTaskOrchestrationWorkItemAsync`` for Reject; a failed
completion with ``FailureDetails("VersionMismatch", ...)`` for Fail; the version of a created
sub-orchestration taken from its action); the extension's test
``OrchestrationVersionTests.ExistingOrchestrationVersionIsImmutable`` (a sub-orchestration started
after the host's default changed gets the new default). The extension's defaults for Durable
Functions, ``CurrentOrOlder`` and ``Reject`` (DTFx's own are ``None`` and ``Reject``), are as
Microsoft Learn's "Orchestration versioning in Durable Functions" states them: the extension's
options source with these settings is not among the snapshots read (docs/local-host.md, row 50).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NONE, STRICT, CURRENT_OR_OLDER = "None", "Strict", "CurrentOrOlder"
REJECT, FAIL = "Reject", "Fail"
MATCH_STRATEGIES = (NONE, STRICT, CURRENT_OR_OLDER)
FAILURE_STRATEGIES = (REJECT, FAIL)

#: What DTFx's failed completion says (``FailureDetails("VersionMismatch", <this>, ...)``).
VERSION_MISMATCH = "VersionMismatch: Orchestration version did not comply with Worker Versioning"

_INT32_MAX = 2**31 - 1
_COMPONENT = re.compile(r"^\s*\+?\d+\s*$")


def _system_version(text: str) -> tuple[int, int, int, int] | None:
    """.NET's ``System.Version.TryParse``: two to four non-negative 32-bit numbers separated by
    dots; build and revision left out count as -1 (so "1.0" is older than "1.0.0")."""
    parts = text.split(".")
    if not 2 <= len(parts) <= 4 or not all(_COMPONENT.match(p) for p in parts):
        return None
    numbers = [int(p) for p in parts]
    if any(n > _INT32_MAX for n in numbers):
        return None
    major, minor, build, revision = (numbers + [-1, -1])[:4]
    return major, minor, build, revision


def compare_versions(source: str | None, other: str | None) -> int:
    """DTFx's ``VersioningSettings.CompareVersions``: negative, 0 or positive as ``source`` is
    older than, equal to or newer than ``other``."""
    source_empty, other_empty = not (source or "").strip(), not (other or "").strip()
    if source_empty and other_empty:
        return 0
    if source_empty:
        return -1
    if other_empty:
        return 1
    assert source is not None and other is not None
    parsed_source, parsed_other = _system_version(source), _system_version(other)
    if parsed_source is not None and parsed_other is not None:
        return (parsed_source > parsed_other) - (parsed_source < parsed_other)
    # string.Compare(..., StringComparison.OrdinalIgnoreCase) compares the upper-cased texts.
    a, b = source.upper(), other.upper()
    return (a > b) - (a < b)


def _choice(value: object, allowed: tuple[str, ...], name: str) -> str:
    """An enum setting as the extension binds it from host.json: by name, ignoring case."""
    text = str(value)
    for option in allowed:
        if text.lower() == option.lower():
            return option
    raise ValueError(f"host.json durableTask.{name} must be one of {', '.join(allowed)}: {value!r}")


@dataclass(frozen=True)
class Versioning:
    """One host's versioning settings."""

    #: host.json ``defaultVersion``: stamped on the instances this host creates, and the version
    #: its matching compares an instance's with. "" when not set (unversioned).
    default_version: str = ""
    match_strategy: str = CURRENT_OR_OLDER
    failure_strategy: str = REJECT

    @classmethod
    def from_durable_task(cls, durable: dict) -> Versioning:
        """From host.json's ``extensions.durableTask`` section (``"defaultVersion": null`` is
        the same as leaving it out)."""
        return cls(
            default_version=str(durable.get("defaultVersion") or ""),
            match_strategy=_choice(
                durable.get("versionMatchStrategy", CURRENT_OR_OLDER), MATCH_STRATEGIES, "versionMatchStrategy"
            ),
            failure_strategy=_choice(
                durable.get("versionFailureStrategy", REJECT), FAILURE_STRATEGIES, "versionFailureStrategy"
            ),
        )

    def stamp(self, requested: str | None) -> str:
        """The version a new instance gets: the one asked for, else this host's default."""
        return self.default_version if requested is None else requested

    def may_run(self, version: str | None) -> bool:
        """TaskOrchestrationDispatcher's check before it runs an episode of an instance."""
        if self.match_strategy == STRICT:
            return (version or "") == self.default_version
        if self.match_strategy == CURRENT_OR_OLDER:
            return compare_versions(version, self.default_version) <= 0
        return True

    def rejects(self, version: str | None) -> bool:
        """The instance is left as it is, for a host that may run it."""
        return not self.may_run(version) and self.failure_strategy == REJECT

    def fails(self, version: str | None) -> bool:
        """The instance is failed (VersionMismatch) instead of run."""
        return not self.may_run(version) and self.failure_strategy == FAIL
