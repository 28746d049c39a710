"""What a job's outputs are made to: the window grid, the block size and the output profile.

The spec is part of the job's identity (:func:`tilecommit.jobs.job_id_for`) and travels in the
job's payload; everything that decides a job's output bytes or keys reads it from there, never
from the app settings, which only give the spec of jobs not yet started. A job started before a
change of ``TILECOMMIT_WINDOW_SIZE`` so finishes on its own grid, and the same upload under
another spec is another job with keys of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .records import Record
from .settings import DEFAULT_WINDOW_SIZE, SETTING_WINDOW_SIZE, Settings

#: Edge of every tile's and the mosaic's internal blocks, in pixels.
DEFAULT_BLOCK_SIZE = 256
#: The block sizes this build encodes and assembles: the tile encoder, the block-copy assembly
#: and the mosaic's checks are written and measured for this one, so a spec naming another is refused.
SUPPORTED_BLOCK_SIZES = (DEFAULT_BLOCK_SIZE,)
#: Output profiles: a profile names the tile and mosaic creation options. One for now.
DEFAULT_PROFILE = "default"
PROFILES = (DEFAULT_PROFILE,)


@dataclass(frozen=True)
class OutputSpec(Record):
    """The values, besides the upload itself, that decide a job's outputs.

    A field added later must keep today's jobs' ids unchanged only if its default is left out
    of :meth:`canonical`; as it stands, every field is hashed.
    """

    window_size: int = DEFAULT_WINDOW_SIZE
    block_size: int = DEFAULT_BLOCK_SIZE
    profile: str = DEFAULT_PROFILE

    JSON_IN = {"window_size": int, "block_size": int, "profile": str}

    def __post_init__(self) -> None:
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise ConfigurationError(
                f"block size {self.block_size}: this build encodes blocks of {SUPPORTED_BLOCK_SIZES} pixels only"
            )
        if self.window_size <= 0 or self.window_size % self.block_size:
            raise ConfigurationError(
                f"{SETTING_WINDOW_SIZE}={self.window_size}: the window size must be a positive "
                f"multiple of {self.block_size} (the mosaic's internal block size)"
            )
        if self.profile not in PROFILES:
            raise ConfigurationError(f"output profile {self.profile!r}: expected one of {', '.join(PROFILES)}")

    @classmethod
    def from_settings(cls, settings: Settings) -> OutputSpec:
        """The spec a job started now gets: the window size the app settings name."""
        return cls(window_size=settings.window_size)

    def canonical(self) -> str:
        """One text for one spec (sorted keys, no spaces): what the job id hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def spec_of(job: dict[str, Any]) -> OutputSpec:
    """The spec of a job payload the starter made.

    A payload from before the spec was part of it carries only ``window_size``; its tiles were
    made with the default block size and profile, which is what it gets.
    """
    if "spec" in job:
        return OutputSpec.from_dict(job["spec"])
    return OutputSpec(window_size=int(job["window_size"]))
