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

from . import profiles
from .errors import BadInputError, ConfigurationError
from .records import Record
from .settings import DEFAULT_WINDOW_SIZE, SETTING_WINDOW_SIZE, Settings

#: Edge of every tile's and the mosaic's internal blocks, in pixels, unless the profile's
#: ``blocksize`` names another (tilecommit/profiles.py).
DEFAULT_BLOCK_SIZE = profiles.DEFAULT_BLOCK_SIZE
#: The block sizes this build encodes and assembles (the tile encoder, the block-copy assembly,
#: the mosaic's checks); a spec naming another is refused.
SUPPORTED_BLOCK_SIZES = profiles.BLOCK_SIZES
#: The profile of jobs that name none (tilecommit/profiles.py has them all).
DEFAULT_PROFILE = profiles.DEFAULT


def _options_in(value: Any) -> tuple[tuple[str, int | float | str], ...]:
    return tuple(sorted((str(k), profiles.option_value(str(k), v)) for k, v in dict(value or {}).items()))


@dataclass(frozen=True)
class OutputSpec(Record):
    """The values, besides the upload itself, that decide a job's outputs.

    A field added later keeps today's jobs' ids (and their STAC items) unchanged by being left
    out of :meth:`to_dict`, and so of :meth:`canonical`, while it has its default: so
    ``profile_options`` (the options given on top of the profile, tilecommit/profiles.py).
    """

    window_size: int = DEFAULT_WINDOW_SIZE
    block_size: int = DEFAULT_BLOCK_SIZE
    profile: str = DEFAULT_PROFILE
    profile_options: tuple[tuple[str, int | float | str], ...] = ()

    JSON_IN = {"window_size": int, "block_size": int, "profile": str, "profile_options": _options_in}

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
        checked = profiles.choose(
            self.profile, dict(self.profile_options), where="output spec", error=ConfigurationError
        )
        if checked != self.choice:
            raise ConfigurationError(f"output spec: profile {self.profile!r} is spelled {checked.name!r} here")

    @property
    def choice(self) -> profiles.Choice:
        return profiles.Choice(self.profile, self.profile_options)

    def overview_resampling(self, default: str) -> str:
        """The overviews' resampling: the profile's ``resampling`` option, else ``default`` (the
        scene's: average, nearest for paletted data)."""
        return str(self.choice.option("resampling") or default)

    def to_dict(self) -> dict:
        data = super().to_dict()
        if self.profile_options:
            data["profile_options"] = dict(self.profile_options)
        else:
            del data["profile_options"]
        return data

    @classmethod
    def from_settings(cls, settings: Settings) -> OutputSpec:
        """The spec of a job that names no profile and matches no rule: the window size and
        default profile the app settings name."""
        return cls.with_choice(settings.window_size, settings.default_profile())

    @classmethod
    def for_upload(cls, settings: Settings, blob_name: str, metadata: dict[str, str] | None) -> OutputSpec:
        """The spec of a job started now for the upload ``blob_name`` with its blob ``metadata``:
        the window size of the app settings, the profile :func:`tilecommit.profiles.resolve`
        chooses. Raises :class:`~tilecommit.errors.BadInputError` for metadata naming what this
        build cannot make."""
        choice = profiles.resolve(
            metadata or {}, blob_name, rules=settings.profile_rule_list(), default=settings.default_profile()
        )
        try:
            return cls.with_choice(settings.window_size, choice)
        except ConfigurationError as exc:  # the metadata's block size and the app's window size
            raise BadInputError(f"blob metadata {profiles.METADATA_PROFILE}: {exc}") from exc

    @classmethod
    def started_for(
        cls, settings: Settings, blob_name: str, metadata: dict[str, str] | None
    ) -> tuple[OutputSpec, str | None]:
        """The spec a job started for this upload gets, and why its metadata cannot be made
        (None when it can). Metadata naming what this build cannot make still gives a job, with
        the settings' spec, which fails at once saying why (client_functions/starter.py)."""
        try:
            return cls.for_upload(settings, blob_name, metadata), None
        except BadInputError as exc:
            return cls.from_settings(settings), str(exc)

    @classmethod
    def with_choice(cls, window_size: int, choice: profiles.Choice) -> OutputSpec:
        """The spec of ``choice`` at ``window_size``: its ``blocksize`` option is the spec's block
        size, the others stay the profile's options."""
        options = dict(choice.options)
        block_size = int(options.pop("blocksize", DEFAULT_BLOCK_SIZE))
        return cls(
            window_size=window_size,
            block_size=block_size,
            profile=choice.name,
            profile_options=tuple(sorted(options.items())),
        )

    def canonical(self) -> str:
        """One text for one spec (sorted keys, no spaces): what the job id hashes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
