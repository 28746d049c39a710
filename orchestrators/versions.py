"""Which steps each version of the job orchestration runs: the one place that says so.

Durable stamps every new instance with host.json's ``defaultVersion`` (``context.version``, the
same in every replay, on whichever host), and a host runs only instances of its own version or
older ones (``versionMatchStrategy: CurrentOrOlder``). So a deploy that changes the sequence of
steps adds a version here, and every instance goes on with the steps of the version it started
with (docs/deployment.md, "Changing the orchestrations").

Versions:

- **1**: every instance started before versions (``context.version`` "" or None; "1" and "1.0"
  mean the same).
- **2.0**: the same steps. It is stamped so that the next release that changes the steps can
  tell the jobs this code started from its own, and so that the job API shows which version
  each job runs (its progress's ``version``).
- **3.0**: before the mosaic's staging and commit, the nodes of its coarse-level reduction tree,
  stage after stage, each stage's nodes all at once (``reduce_level_node``;
  tilecommit/raster/assembly/reduction.py), when the job's payload plans a tree.
- **4.0** (this release): the scrub's repair runs the same tree before it rebuilds the mosaic, so
  the nodes over a tile the repair gave other bytes, and any intermediate damaged since, are
  repaired in the same scrub (before, the rebuild refused and the operator ran the job again,
  then the repair again). The job's steps are 3.0's.

Both add the job's item to its collection only when the payload names a collection. That rule
stays with the payload, not the version: the releases before versions started jobs with and
without one, and a failed job started again (the job API's retry, the starter's restart of a
failed job) is a new instance stamped with the current version but carrying its old payload, so
a payload made before collections must still mean no collection step, whatever the version.

Versions are written "major.minor": the Durable Task Framework compares two versions by their
numbers only when both parse as .NET's ``System.Version`` (two to four numbers), otherwise as
text, and as text "10" is older than "9".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: This release's version of the job orchestration: host.json's ``defaultVersion``
#: (tests/test_versions.py checks that they agree).
CURRENT = "4.0"
#: What an instance started before versions reads as ``context.version``, and its aliases.
UNVERSIONED = ("", "1", "1.0")


@dataclass(frozen=True)
class JobSteps:
    """The steps of one version that differ between versions."""

    #: Add the job's item to its collection after the assembly: True always, False never, None
    #: when the job's payload names a collection (how the releases before versions decided).
    collection: bool | None
    #: Run the coarse-level reduction tree before the commit (when the job's payload plans one).
    level_tree: bool = False
    #: The scrub's repair runs the reduction tree before it rebuilds the mosaic (likewise).
    repair_level_tree: bool = False


#: Every version this code still runs, oldest first. A version is removed only once no instance of
#: it is left (docs/deployment.md, "Retiring a version").
VERSIONS: dict[str, JobSteps] = {
    "1": JobSteps(collection=None),
    "2.0": JobSteps(collection=None),
    "3.0": JobSteps(collection=None, level_tree=True),
    CURRENT: JobSteps(collection=None, level_tree=True, repair_level_tree=True),
}


def version_of(context_version: str | None) -> str:
    """The version an instance runs, from ``context.version``."""
    return "1" if (context_version or "").strip() in UNVERSIONED else str(context_version)


def steps_for(context_version: str | None) -> JobSteps:
    """The steps of the instance's version. A version this code does not know is one a newer
    release stamped: the host's version matching never hands it to this code, so meeting one
    is a deployment error, said as such."""
    version = version_of(context_version)
    try:
        return VERSIONS[version]
    except KeyError:
        raise LookupError(
            f"orchestration version {version!r} is not one this release runs ({', '.join(VERSIONS)}): "
            "is host.json's versionMatchStrategy still CurrentOrOlder?"
        ) from None


def runs_collection_step(context_version: str | None, job: dict[str, Any]) -> bool:
    steps = steps_for(context_version)
    return job.get("collection") is not None if steps.collection is None else steps.collection


def status_fields(context_version: str | None) -> dict[str, str]:
    """What the job's custom status says about its version: nothing for version 1 (its recorded
    custom status stays as it was), ``{"version": ...}`` for later ones, so the job API shows
    which version each running job is on."""
    version = version_of(context_version)
    return {} if version == "1" else {"version": version}


def child_version(context_version: str | None) -> str | None:
    """The version a job's sub-orchestrations are started with: the job's own, so a whole job
    runs one version's steps; None for version 1 (its recorded actions name none, and the host
    then stamps its default, which the batch steps of version 1 do not read)."""
    version = version_of(context_version)
    return None if version == "1" else version
