"""Output profiles: how a job's tiles and mosaic are compressed, chosen per upload.

A profile is a named set of COG creation options, as ``rio cogeo create --cog-profile`` names
them, plus the options a user may set on top (``level``, ``predictor``). The choice, in order:

1. the upload's blob metadata: ``tilecommit_profile`` and the option keys ``tilecommit_level``,
   ``tilecommit_predictor`` (any of them present: the metadata decides, from the default profile
   when it names none);
2. the first path rule of ``TILECOMMIT_PROFILE_RULES`` whose prefix the upload's name starts with
   (``dem/=zstd,predictor=3;previews/=lzw``; the longest prefix wins);
3. the app's default, ``TILECOMMIT_PROFILE`` (``default``).

The resolved choice is part of the job's output spec, and so of its id: the same upload version
with another profile is another job. Nothing here reads storage or settings: the starter hands
in the metadata and the name, :mod:`tilecommit.settings` the two settings' text.

The profiles this build makes are lossless, so every one of them is checked pixel for pixel like
the default. Lossy compressions (JPEG, WEBP, LERC) are refused with that reason: the mosaic is
assembled from the tiles' compressed blocks, and the checks that a tile and the mosaic hold
exactly the source's pixels would need a tolerance that says what each loses first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import BadInputError, ConfigurationError

DEFAULT = "default"
#: Name -> (COMPRESS, default level or None when the codec takes none). ``default`` is what every
#: job was made with before profiles existed: DEFLATE at libdeflate's level 6, pinned so the bytes
#: do not drift with GDAL's default.
PROFILES: dict[str, tuple[str, int | None]] = {
    DEFAULT: ("DEFLATE", 6),
    "zstd": ("ZSTD", 9),
    "lzw": ("LZW", None),
    "raw": ("NONE", None),
}
#: Other spellings of the same output, so they make the same job (``deflate`` is rio-cogeo's name).
ALIASES = {"deflate": DEFAULT}
#: Names users may know from rio-cogeo or GDAL that this build refuses, and why.
REFUSED = {
    name: "lossy: this build makes lossless outputs only (the tiles and the mosaic are checked to hold "
    "exactly the source's pixels)"
    for name in ("jpeg", "webp", "lerc", "lerc_deflate", "lerc_zstd")
}
#: Each codec's levels (GDAL's LEVEL creation option).
LEVELS = {"DEFLATE": range(1, 13), "ZSTD": range(1, 23)}
#: PREDICTOR values: 1 none, 2 horizontal differencing, 3 floating point (floats only).
PREDICTORS = (1, 2, 3)
OPTION_KEYS = ("level", "predictor")
METADATA_PREFIX = "tilecommit_"
METADATA_PROFILE = f"{METADATA_PREFIX}profile"


@dataclass(frozen=True)
class Choice:
    """A resolved profile: its name and the options given on top of it (sorted pairs)."""

    name: str = DEFAULT
    options: tuple[tuple[str, int], ...] = ()

    @property
    def compress(self) -> str:
        return PROFILES[self.name][0]

    def option(self, key: str) -> int | None:
        return dict(self.options).get(key)


DEFAULT_CHOICE = Choice()


def choose(name: str, options: Mapping[str, Any], *, where: str, error: type[BadInputError] = BadInputError) -> Choice:
    """The profile ``name`` with ``options``, checked; ``where`` says where they were given (for
    the message: a metadata key, a setting). Raises ``error`` naming the key, the value and what
    is accepted."""
    key = (name or DEFAULT).strip().lower()
    key = ALIASES.get(key, key)
    if key in REFUSED:
        raise error(f"{where}: profile {name!r} is refused: {REFUSED[key]}; accepted: {', '.join(accepted())}")
    if key not in PROFILES:
        raise error(f"{where}: profile {name!r} is not one of {', '.join(accepted())}")
    compress = PROFILES[key][0]
    checked: dict[str, int] = {}
    for option, raw in options.items():
        if option not in OPTION_KEYS:
            raise error(f"{where}: option {option!r} is not one of {', '.join(OPTION_KEYS)}")
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise error(f"{where}: {option}={raw!r} is not a whole number") from None
        if option == "level" and value not in LEVELS.get(compress, ()):
            levels = LEVELS.get(compress)
            allowed = f"{levels.start}..{levels.stop - 1}" if levels else "none (the codec has no levels)"
            raise error(f"{where}: level={value} for {compress}: accepted {allowed}")
        if option == "predictor" and (value not in PREDICTORS or (compress == "NONE" and value != 1)):
            allowed = "1 (no compression, no predictor)" if compress == "NONE" else "1, 2 or 3"
            raise error(f"{where}: predictor={value} for {compress}: accepted {allowed}")
        if option == "level" and value == PROFILES[key][1]:
            continue  # the profile's own level: the same output, so the same job
        checked[option] = value
    return Choice(key, tuple(sorted(checked.items())))


def accepted() -> list[str]:
    return [*PROFILES, *ALIASES]


def split(text: str, *, where: str, error: type[BadInputError] = BadInputError) -> tuple[str, dict[str, str]]:
    """``name[,key=value...]`` as the name and its options, unchecked (keys in lower case)."""
    name, *pairs = [part.strip() for part in text.split(",")]
    options = {}
    for pair in pairs:
        option, sep, value = pair.partition("=")
        if not sep:
            raise error(f"{where}: {pair!r} is not key=value")
        options[option.strip().lower()] = value.strip()
    return name, options


def parse(text: str, *, where: str, error: type[BadInputError] = BadInputError) -> Choice:
    """``name[,key=value...]`` (a setting's or a rule's text) as a :class:`Choice`."""
    name, options = split(text, where=where, error=error)
    return choose(name, options, where=where, error=error)


def parse_rules(text: str, *, where: str) -> list[tuple[str, Choice]]:
    """``prefix=profile[,key=value...];...`` as (prefix, choice), the longest prefix first."""
    rules = []
    for rule in filter(None, (r.strip() for r in text.split(";"))):
        prefix, sep, choice = rule.partition("=")
        if not sep or not prefix.strip():
            raise ConfigurationError(f"{where}: rule {rule!r} is not prefix=profile")
        rules.append(
            (prefix.strip(), parse(choice, where=f"{where} rule {prefix.strip()!r}", error=ConfigurationError))
        )
    return sorted(rules, key=lambda r: -len(r[0]))


def resolve(metadata: Mapping[str, str], blob_name: str, *, rules: list[tuple[str, Choice]], default: Choice) -> Choice:
    """The profile of one upload: its metadata's, else its path rule's, else the default.

    Raises :class:`BadInputError` for metadata that names what this build cannot make: the job
    of that upload fails at once, saying which key, which value and what is accepted.
    """
    given = {k.lower(): v for k, v in (metadata or {}).items() if k.lower().startswith(METADATA_PREFIX)}
    if given:
        name = given.pop(METADATA_PROFILE, DEFAULT)
        options = {k[len(METADATA_PREFIX) :]: v for k, v in given.items()}
        return choose(name, options, where=f"blob metadata {METADATA_PROFILE}")
    for prefix, choice in rules:
        if blob_name.startswith(prefix):
            return choice
    return default


def creation_options(choice: Choice, dtype: str) -> dict[str, Any]:
    """The COMPRESS / LEVEL / PREDICTOR creation options of a tile (and of the mosaic) of ``dtype``.

    The predictor, unless the choice names one: 2 (horizontal differencing) for integers, 3
    (floating point) for floats; none without compression.
    """
    compress, level = PROFILES[choice.name]
    options: dict[str, Any] = {"COMPRESS": compress}
    level = choice.option("level") or level
    if level is not None:
        options["LEVEL"] = level
    if compress != "NONE":
        options["PREDICTOR"] = choice.option("predictor") or default_predictor(dtype)
    return options


def overview_options(choice: Choice, dtype: str) -> dict[str, Any]:
    """The same encoding as GDAL's configuration options for overviews built into a GeoTIFF
    (the mosaic's coarse levels)."""
    made = creation_options(choice, dtype)
    options: dict[str, Any] = {
        "COMPRESS_OVERVIEW": made["COMPRESS"],
        "PREDICTOR_OVERVIEW": made.get("PREDICTOR", 1),
    }
    if made["COMPRESS"] == "DEFLATE":
        options["ZLEVEL_OVERVIEW"] = made["LEVEL"]
    elif made["COMPRESS"] == "ZSTD":
        options["ZSTD_LEVEL_OVERVIEW"] = made["LEVEL"]
    return options


def default_predictor(dtype: str) -> int:
    return 3 if np.dtype(dtype).kind == "f" else 2


def check_for(choice: Choice, dtype: str) -> None:
    """Refuse, with the reason, a choice the data cannot take (GDAL would fail later, per tile):
    the floating-point predictor on integers."""
    if choice.option("predictor") == 3 and np.dtype(dtype).kind != "f":
        raise BadInputError(
            f"profile {choice.name!r} with predictor=3 (floating point) on {dtype} data: accepted for "
            "float32 and float64 only; use predictor=2 for integers"
        )
