"""Output profiles: how a job's tiles and mosaic are compressed, chosen per upload.

A profile is a named set of COG creation options, as ``rio cogeo create --cog-profile`` names
them, plus the options a user may set on top (``level``, ``predictor``, ``quality``,
``max_z_error``, ``blocksize``, which the job's spec keeps as its block size, ``resampling``,
``nodata``, which overrides the source's nodata value as ``rio cogeo create --nodata`` does,
``add_mask``, which makes the nodata (or an alpha band) an internal mask as ``--add-mask`` does, and the options
that warp the outputs onto another grid, :mod:`tilecommit.warping`: ``web_optimized``, as
``--web-optimized`` does, ``target_srs`` and ``resolution``, and ``warp_resampling``, that
warp's kernel, as ``--resampling``; and ``variable``, the NetCDF or HDF5 variable the outputs are
made of, as GDAL's ``NETCDF:"file":variable`` names it: one more part of what the outputs are,
carried the same way rather than by a setting of its own). The choice, in order:

1. the upload's blob metadata: ``tilecommit_profile`` and the option keys ``tilecommit_level``,
   ``tilecommit_predictor``, ``tilecommit_quality``, ``tilecommit_max_z_error``,
   ``tilecommit_blocksize``, ``tilecommit_resampling``, ``tilecommit_nodata``,
   ``tilecommit_add_mask``, ``tilecommit_web_optimized``, ``tilecommit_target_srs``,
   ``tilecommit_resolution``, ``tilecommit_warp_resampling``, ``tilecommit_variable`` (any of them present: the metadata decides, from the default profile
   when it names none; ``tilecommit_collection`` is none of them: it chooses the upload's
   collection, tilecommit/catalog/naming.py);
2. the first path rule of ``TILECOMMIT_PROFILE_RULES`` whose prefix the upload's name starts with
   (``dem/=zstd,predictor=3;previews/=lzw``; the longest prefix wins);
3. the app's default, ``TILECOMMIT_PROFILE`` (``default``).

The resolved choice is part of the job's output spec, and so of its id: the same upload version
with another profile is another job. Nothing here reads storage or settings: the starter hands
in the metadata and the name, :mod:`tilecommit.settings` the two settings' text.

Lossless profiles (``default``, ``zstd``, ``lzw``, ``raw``, and the LERC family with
``max_z_error=0``, their default) make tiles whose pixels are the source's, and a scrub compares
them with the source. Lossy ones (``jpeg``, ``webp``; LERC with a ``max_z_error`` above 0) make
tiles whose pixels are what that codec makes of the source: encoding is deterministic, so a scrub
compares a tile with the same window encoded again, and LERC's error is bounded by its
``max_z_error``. A lossy profile is refused, with the reason, on data it would damage
(:func:`check_for`): JPEG on anything but 8-bit data of 1, 3 or 4 bands without alpha, WEBP on
anything but 8-bit RGB or RGBA, either on data with a nodata value (a pixel moved onto or off
that value changes the mask), LERC above 0 on integers with a nodata value (measured: 13 valid
pixels of 262,144 became the nodata value at ``max_z_error=2``); with ``add_mask`` the mask,
encoded losslessly, says what is valid, so those two refusals do not apply, and an alpha band
becomes the mask (JPEG takes RGBA then: its RGB). The mosaic is assembled from the
tiles' compressed blocks, so its full resolution holds exactly the tiles' pixels, for every
profile; its coarse levels are computed and encoded to the same profile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import warping
from .catalog.naming import METADATA_COLLECTION
from .errors import BadInputError, ConfigurationError

DEFAULT = "default"


@dataclass(frozen=True)
class Profile:
    """One profile's codec (GDAL's COMPRESS) and the options it takes, with their defaults."""

    compress: str
    #: LEVEL's default; None: the codec takes none.
    level: int | None = None
    #: Whether PREDICTOR applies (the lossless byte codecs).
    predictor: bool = False
    #: QUALITY's default (JPEG, WEBP); None: the codec takes none.
    quality: int | None = None
    #: Whether MAX_Z_ERROR applies (the LERC family; 0, lossless, by default).
    max_z_error: bool = False
    #: Always lossy (JPEG, WEBP), whatever its options.
    lossy: bool = False


#: ``default`` is what every job was made with before profiles existed: DEFLATE at libdeflate's
#: level 6, pinned so the bytes do not drift with GDAL's default. The others are rio-cogeo's
#: profile names; QUALITY 75 is GDAL's own default for JPEG and WEBP, pinned for the same reason.
PROFILES: dict[str, Profile] = {
    DEFAULT: Profile("DEFLATE", level=6, predictor=True),
    "zstd": Profile("ZSTD", level=9, predictor=True),
    "lzw": Profile("LZW", predictor=True),
    "raw": Profile("NONE"),
    "jpeg": Profile("JPEG", quality=75, lossy=True),
    "webp": Profile("WEBP", quality=75, lossy=True),
    "lerc": Profile("LERC", max_z_error=True),
    "lerc_deflate": Profile("LERC_DEFLATE", max_z_error=True),
    "lerc_zstd": Profile("LERC_ZSTD", max_z_error=True),
}
#: Other spellings of the same output, so they make the same job (``deflate`` is rio-cogeo's name).
ALIASES = {"deflate": DEFAULT}
#: Names users may know from rio-cogeo or GDAL that this build refuses, and why.
REFUSED = {
    "packbits": "PackBits compresses little and is not one of the codecs this build encodes; use lzw or zstd",
}
#: Each codec's levels (GDAL's LEVEL creation option).
LEVELS = {"DEFLATE": range(1, 13), "ZSTD": range(1, 23)}
QUALITIES = range(1, 101)
#: Edge of the tiles' and the mosaic's internal blocks, in pixels (the ``blocksize`` option; the
#: job's spec keeps it as its ``block_size``). 256 is what every job had before it was an option.
BLOCK_SIZES = (256, 512)
DEFAULT_BLOCK_SIZE = 256
#: PREDICTOR values: 1 none, 2 horizontal differencing, 3 floating point (floats only).
PREDICTORS = (1, 2, 3)
#: Overview resampling (the ``resampling`` option; by default average, nearest for paletted data):
#: the kernels whose footprint at a halving is the 2 x 2 pixels it halves, so that a tile's own
#: overviews, made from its window alone, are the whole scene's (no seam at the windows' edges).
RESAMPLINGS = ("nearest", "average", "rms", "mode")
#: The wider kernels, refused with this reason (measured, windows of 512 on a 1100 x 1300 scene:
#: about 0.3 % of the first level's pixels differ from GDAL's overviews of the whole scene with
#: cubic or bilinear; none with the four above, tests/test_lossy_profiles.py).
WIDE_RESAMPLINGS = ("bilinear", "cubic", "cubic_spline", "lanczos", "gauss")
OPTION_KEYS = (
    "level",
    "predictor",
    "quality",
    "max_z_error",
    "blocksize",
    "resampling",
    "nodata",
    "add_mask",
    *warping.OPTIONS,
    "variable",
)
#: Options whose value the spec keeps as text.
TEXT_OPTIONS = ("resampling", "nodata", "add_mask", "web_optimized", "warp_resampling", "target_srs", "variable")
#: What a ``variable`` may be called: a netCDF name (letters, digits, ``_``, ``.``, ``@``, ``+``,
#: ``-``, starting with a letter or ``_``), perhaps in groups (``/group/name``); nothing that could
#: end the quoted file name of GDAL's ``NETCDF:"file":variable`` it is put into.
VARIABLE_NAME = re.compile(r"(/?[A-Za-z_][A-Za-z0-9_.@+-]{0,255})+")
#: How ``add_mask`` may be spelled, and what each spelling means.
BOOLEANS = warping.BOOLEANS
METADATA_PREFIX = "tilecommit_"
METADATA_PROFILE = f"{METADATA_PREFIX}profile"


def option_value(option: str, raw: Any) -> int | float | str:
    """An option's value as the spec keeps it: a float for ``max_z_error``, a name for
    ``resampling`` and ``warp_resampling``, the number's text for ``nodata`` (NaN is no JSON
    number), ``true`` for ``add_mask`` and ``web_optimized``, else a whole number."""
    if option in TEXT_OPTIONS:
        return str(raw)
    return float(raw) if option in ("max_z_error", "resolution") else int(raw)


@dataclass(frozen=True)
class Choice:
    """A resolved profile: its name and the options given on top of it (sorted pairs)."""

    name: str = DEFAULT
    options: tuple[tuple[str, int | float | str], ...] = ()

    @property
    def profile(self) -> Profile:
        return PROFILES[self.name]

    @property
    def compress(self) -> str:
        return self.profile.compress

    def option(self, key: str) -> int | float | str | None:
        return dict(self.options).get(key)

    @property
    def nodata(self) -> float | None:
        """The nodata value that overrides the source's (the ``nodata`` option), or None."""
        text = self.option("nodata")
        return None if text is None else float(text)

    def nodata_for(self, source: float | None) -> float | None:
        """The value that marks no data in a source whose own is ``source``: the override, else that."""
        return self.nodata if self.nodata is not None else None if source is None else float(source)

    def output_nodata(self, source: float | None) -> float | None:
        """The outputs' nodata value: none with ``add_mask`` (the mask stands for it, as
        ``rio cogeo create --add-mask`` drops it), else :meth:`nodata_for`."""
        return None if self.add_mask else self.nodata_for(source)

    @property
    def add_mask(self) -> bool:
        """Whether the outputs get an internal mask for the nodata value, or of the alpha band that
        is the source's valid area (the ``add_mask`` option)."""
        return self.option("add_mask") == "true"

    @property
    def web_optimized(self) -> bool:
        """Whether the outputs are warped onto the WebMercatorQuad grid (the ``web_optimized`` option)."""
        return self.option("web_optimized") == "true"

    @property
    def target_srs(self) -> str | None:
        """The target CRS's EPSG code (the ``target_srs`` option), or None."""
        value = self.option("target_srs")
        return None if value is None else str(value)

    @property
    def resolution(self) -> float | None:
        """The target grid's pixel size (the ``resolution`` option), or None."""
        value = self.option("resolution")
        return None if value is None else float(value)

    @property
    def warped(self) -> bool:
        """Whether the outputs are on another grid than the source's (tilecommit/warping.py)."""
        return self.web_optimized or self.target_srs is not None or self.resolution is not None

    @property
    def warp_resampling(self) -> str:
        """The warp's kernel (the ``warp_resampling`` option), nearest unless given."""
        return str(self.option("warp_resampling") or warping.DEFAULT_WARP_RESAMPLING)

    @property
    def variable(self) -> str | None:
        """The NetCDF or HDF5 variable the outputs are made of (the ``variable`` option), or None:
        the file's one data variable (tilecommit/raster/reading/netcdf.py)."""
        value = self.option("variable")
        return None if value is None else str(value)

    @property
    def lossy(self) -> bool:
        """Whether a tile's pixels may differ from the source's (then a scrub compares a tile
        with the window encoded again, not with the source)."""
        return self.profile.lossy or bool(self.option("max_z_error"))


DEFAULT_CHOICE = Choice()


def _checked_option(
    option: str, raw: Any, profile: Profile, *, where: str, error: type[BadInputError]
) -> int | float | str:
    """``raw`` as the option's value for ``profile``, or ``error`` saying what is accepted."""
    compress = profile.compress
    if option == "resampling":
        value = str(raw).strip().lower()
        if value in WIDE_RESAMPLINGS:
            raise error(
                f"{where}: resampling={value} is refused: its kernel reaches past the 2 x 2 pixels each overview "
                "pixel halves, so the tiles' overviews, each made from its own window, would not be the whole "
                f"scene's; accepted: {', '.join(RESAMPLINGS)}"
            )
        if value not in RESAMPLINGS:
            raise error(f"{where}: resampling={raw!r}: accepted {', '.join(RESAMPLINGS)}")
        return value
    if option == "add_mask":
        value = str(raw).strip().lower()
        if value not in BOOLEANS:
            raise error(f"{where}: add_mask={raw!r}: accepted {', '.join(BOOLEANS)}")
        return "true" if BOOLEANS[value] else "false"
    if option in warping.OPTIONS:
        return warping.checked_option(option, raw, where=where, error=error)
    if option == "variable":
        name = str(raw).strip()
        if not VARIABLE_NAME.fullmatch(name):
            raise error(
                f"{where}: variable={raw!r}: accepted a NetCDF variable name (letters, digits, _ . @ + -, not "
                "starting with a digit), in groups as /group/name"
            )
        return name
    if option == "nodata":
        try:
            nodata = float(str(raw).strip())
        except ValueError:
            raise error(f"{where}: nodata={raw!r} is not a number (nan for not-a-number)") from None
        if math.isinf(nodata):
            raise error(f"{where}: nodata={raw}: accepted a finite number, or nan")
        return "nan" if math.isnan(nodata) else repr(nodata)
    if option == "max_z_error":
        try:
            max_z_error = float(str(raw).strip())
        except ValueError:
            raise error(f"{where}: max_z_error={raw!r} is not a number") from None
        if not profile.max_z_error:
            raise error(f"{where}: max_z_error for {compress}: accepted for lerc, lerc_deflate and lerc_zstd only")
        if not math.isfinite(max_z_error) or max_z_error < 0:
            raise error(f"{where}: max_z_error={raw} for {compress}: accepted a finite number >= 0 (0: lossless)")
        return max_z_error
    try:
        number = int(str(raw).strip())
    except ValueError:
        raise error(f"{where}: {option}={raw!r} is not a whole number") from None
    if option == "level" and number not in LEVELS.get(compress, ()):
        levels = LEVELS.get(compress)
        allowed = f"{levels.start}..{levels.stop - 1}" if levels else "none (the codec has no levels)"
        raise error(f"{where}: level={number} for {compress}: accepted {allowed}")
    if option == "predictor" and not (
        (profile.predictor and number in PREDICTORS) or (compress == "NONE" and number == 1)
    ):
        if compress == "NONE":
            allowed = "1 (no compression, no predictor)"
        elif profile.predictor:
            allowed = "1, 2 or 3"
        else:
            allowed = "none (the codec takes no predictor)"
        raise error(f"{where}: predictor={number} for {compress}: accepted {allowed}")
    if option == "blocksize" and number not in BLOCK_SIZES:
        raise error(f"{where}: blocksize={number}: accepted {' or '.join(map(str, BLOCK_SIZES))}")
    if option == "quality" and (profile.quality is None or number not in QUALITIES):
        allowed = "1..100" if profile.quality is not None else "none (jpeg and webp only)"
        raise error(f"{where}: quality={number} for {compress}: accepted {allowed}")
    return number


def _default_of(option: str, profile: Profile) -> int | float | str | None:
    """The value an option has when not given: giving it makes the same output, so the same job."""
    return {
        "level": profile.level,
        "quality": profile.quality,
        "max_z_error": 0.0 if profile.max_z_error else None,
        "blocksize": DEFAULT_BLOCK_SIZE,
        "add_mask": "false",
        **warping.DEFAULTS,
    }.get(option)


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
    profile = PROFILES[key]
    checked: dict[str, int | float | str] = {}
    for option, raw in options.items():
        if option not in OPTION_KEYS:
            raise error(f"{where}: option {option!r} is not one of {', '.join(OPTION_KEYS)}")
        value = _checked_option(option, raw, profile, where=where, error=error)
        if value == _default_of(option, profile):
            continue  # the profile's own value: the same output, so the same job
        checked[option] = value
    warping.check_combination(checked, where=where, error=error)
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
    given = {
        k.lower(): v
        for k, v in (metadata or {}).items()
        if k.lower().startswith(METADATA_PREFIX) and k.lower() != METADATA_COLLECTION  # not the profile's
    }
    if given:
        name = given.pop(METADATA_PROFILE, DEFAULT)
        options = {k[len(METADATA_PREFIX) :]: v for k, v in given.items()}
        return choose(name, options, where=f"blob metadata {METADATA_PROFILE}")
    for prefix, choice in rules:
        if blob_name.startswith(prefix):
            return choice
    return default


def creation_options(choice: Choice, dtype: str) -> dict[str, Any]:
    """The COG driver's COMPRESS / LEVEL / PREDICTOR / QUALITY / MAX_Z_ERROR options of a tile
    (and of the mosaic through a VRT) of ``dtype``.

    The predictor, unless the choice names one: 2 (horizontal differencing) for integers, 3
    (floating point) for floats; none without compression and for the codecs that take none.
    JPEG on three bands is written as YCbCr by the COG driver itself, as rio-cogeo's profile asks.
    """
    profile = choice.profile
    options: dict[str, Any] = {"COMPRESS": profile.compress}
    level = choice.option("level") or profile.level
    if level is not None:
        options["LEVEL"] = level
    if profile.predictor:
        options["PREDICTOR"] = choice.option("predictor") or default_predictor(dtype)
    if profile.quality is not None:
        options["QUALITY"] = choice.option("quality") or profile.quality
    if profile.max_z_error:
        options["MAX_Z_ERROR"] = choice.option("max_z_error") or 0.0
    return options


def overview_options(choice: Choice, dtype: str) -> dict[str, Any]:
    """The same encoding as GDAL's configuration options for overviews (GTiff's ``*_OVERVIEW``
    options, read when overviews are built into a GeoTIFF and when the COG driver writes a
    tile's overviews)."""
    made = creation_options(choice, dtype)
    compress = made["COMPRESS"]
    options: dict[str, Any] = {"COMPRESS_OVERVIEW": compress, "PREDICTOR_OVERVIEW": made.get("PREDICTOR", 1)}
    if compress == "DEFLATE":
        options["ZLEVEL_OVERVIEW"] = made["LEVEL"]
    elif compress == "ZSTD":
        options["ZSTD_LEVEL_OVERVIEW"] = made["LEVEL"]
    elif compress == "JPEG":
        options["JPEG_QUALITY_OVERVIEW"] = made["QUALITY"]
    elif compress == "WEBP":
        options["WEBP_LEVEL_OVERVIEW"] = made["QUALITY"]
    if "MAX_Z_ERROR" in made:
        options["MAX_Z_ERROR_OVERVIEW"] = made["MAX_Z_ERROR"]
    return options


def coarse_level_options(choice: Choice, dtype: str, count: int) -> dict[str, Any]:
    """:func:`overview_options` for the mosaic's coarse levels, built on a copy of one of its
    levels: three-band JPEG as YCbCr, as the COG driver writes the tiles (it sets that itself
    for a tile's overviews, and refuses the option on its temporary uncompressed file)."""
    options = overview_options(choice, dtype)
    if choice.compress == "JPEG" and count == 3:
        options.update(PHOTOMETRIC_OVERVIEW="YCBCR", INTERLEAVE_OVERVIEW="PIXEL")
    return options


def default_predictor(dtype: str) -> int:
    return 3 if np.dtype(dtype).kind == "f" else 2


def check_for(choice: Choice, dtype: str, *, count: int, nodata: float | None, alpha: bool) -> None:
    """Refuse, with the reason, a choice the data cannot take (GDAL would fail later, per tile)
    or would damage (the module's notes). ``alpha``: the source has an alpha band (with
    ``add_mask`` it becomes the mask: the codec encodes the other bands; whether it can is
    decided with the source open, tilecommit/raster/reading/alpha.py)."""
    compress, kind = choice.compress, np.dtype(dtype).kind
    error = choice.option("max_z_error")
    name = choice.name
    unfit = _nodata_unfit(choice.nodata, dtype) if choice.nodata is not None else None
    if choice.add_mask:
        nodata = None  # it becomes the mask, which the codec leaves exact: no value to move pixels onto
        if alpha:
            count, alpha = count - 1, False  # the alpha band too, dropped into the mask
    if unfit:
        why = unfit
    elif choice.option("predictor") == 3 and kind != "f":
        why = f"predictor=3 (floating point) on {dtype} data: accepted for float32 and float64 only; use predictor=2 for integers"
    elif compress == "JPEG" and (dtype != "uint8" or count not in (1, 3, 4)):
        why = f"JPEG on {count}-band {dtype} data: JPEG takes 8-bit data (uint8) of 1, 3 or 4 bands; use lerc or zstd"
    elif compress == "JPEG" and alpha:
        why = "JPEG on data with an alpha band: JPEG would blur the alpha band's edges; use webp, whose alpha is exact"
    elif compress == "WEBP" and (dtype != "uint8" or count not in (3, 4)):
        why = f"WEBP on {count}-band {dtype} data: WEBP takes 8-bit RGB or RGBA (uint8, 3 or 4 bands)"
    elif choice.profile.lossy and nodata is not None:
        why = (
            f"{compress} on data with a nodata value ({nodata}): a lossy codec moves pixels onto and off that "
            "value, so the valid area would change; use a lossless profile, or add_mask=true (an internal mask instead of nodata)"
        )
    elif error and kind in "iu" and nodata is not None:
        why = (
            f"max_z_error={error} on {dtype} data with a nodata value ({nodata}): LERC rounds valid pixels onto "
            "the nodata value; use max_z_error=0, or add_mask=true (an internal mask instead of nodata)"
        )
    else:
        return
    raise BadInputError(
        f"profile {name!r} with {why}"
        if why.startswith(("predictor", "nodata", "add_mask"))
        else f"profile {name!r}: {why}"
    )


def _nodata_unfit(nodata: float, dtype: str) -> str | None:
    """Why ``nodata`` cannot be a value of ``dtype`` data (GDAL would compare the pixels with a
    value none of them can hold), or None."""
    kind = np.dtype(dtype).kind
    if kind in "iu":
        info = np.iinfo(dtype)
        if math.isnan(nodata) or nodata != int(nodata) or not info.min <= nodata <= info.max:
            return f"nodata={nodata:g} on {dtype} data: accepted a whole number from {info.min} to {info.max}"
    elif not math.isnan(nodata) and abs(nodata) > float(np.finfo(dtype).max):
        return f"nodata={nodata:g} on {dtype} data: beyond the largest {dtype} ({float(np.finfo(dtype).max):g})"
    return None
