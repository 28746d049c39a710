"""The profile options that put a job's outputs on another grid than the source's, checked.

- ``web_optimized``: the WebMercatorQuad grid ``rio cogeo create --web-optimized`` makes;
- ``target_srs`` (an EPSG code) and ``resolution`` (in the target CRS's units): the grid
  ``gdalwarp -t_srs CRS -tr RES RES -tap`` makes, its edges multiples of the resolution; either
  alone keeps the other as GDAL suggests it (the source's CRS; the resolution GDAL's warp keeps);
- ``warp_resampling``: the warp's kernel, for any of them.

Pure: the values are checked as text (an EPSG code's form, a positive number), never looked up;
the grid itself is computed where rasterio is (``tilecommit/raster/reading/warp.py``), which
refuses a code PROJ does not know. Every default is the option left out, so the same job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import BadInputError

#: The warp's kernels, nearest by default as ``rio cogeo create --resampling``: those whose
#: output pixel is computed from the source pixels under it alone, so that a window warped on its
#: own is the whole scene's warp there (tilecommit/raster/reading/warp.py).
WARP_RESAMPLINGS = ("nearest", "average", "mode", "rms")
#: Refused for the warp, with this reason: GDAL 3.10's warper widens their kernel when it
#: downsamples by the ratio of each chunk's source and destination sizes, so a window's pixels
#: would depend on where its edges fall (measured on a geographic scene warped 70:1, windows of
#: 256 against one chunk: 30 pixels differ with bilinear, 30 with cubic, none with nearest or
#: average; tests/test_web_optimized.py's antimeridian scene).
WIDE_WARP_RESAMPLINGS = ("bilinear", "cubic", "cubic_spline", "lanczos")
DEFAULT_WARP_RESAMPLING = "nearest"
OPTIONS = ("web_optimized", "warp_resampling", "target_srs", "resolution")
DEFAULTS = {"web_optimized": "false", "warp_resampling": DEFAULT_WARP_RESAMPLING}
#: How ``web_optimized`` (and ``add_mask``) may be spelled, and what each spelling means.
BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_EPSG = re.compile(r"EPSG:([0-9]{1,6})")


def checked_option(option: str, raw: Any, *, where: str, error: type[BadInputError]) -> str | float:
    """``raw`` as the spec keeps the warp option ``option``, or ``error`` saying what is accepted."""
    text = str(raw).strip()
    if option == "web_optimized":
        if text.lower() not in BOOLEANS:
            raise error(f"{where}: web_optimized={raw!r}: accepted {', '.join(BOOLEANS)}")
        return "true" if BOOLEANS[text.lower()] else "false"
    if option == "warp_resampling":
        value = text.lower()
        if value in WIDE_WARP_RESAMPLINGS:
            raise error(
                f"{where}: warp_resampling={value} is refused: where the warp downsamples, GDAL widens its kernel "
                "by each chunk's scale, so a window's pixels would depend on where its edges fall; accepted: "
                f"{', '.join(WARP_RESAMPLINGS)}"
            )
        if value not in WARP_RESAMPLINGS:
            raise error(f"{where}: warp_resampling={raw!r}: accepted {', '.join(WARP_RESAMPLINGS)}")
        return value
    if option == "target_srs":
        match = _EPSG.fullmatch(text.upper())
        if not match:
            raise error(f"{where}: target_srs={raw!r}: accepted an EPSG code, EPSG:<number> (EPSG:4326, EPSG:32633)")
        return f"EPSG:{int(match.group(1))}"
    try:
        resolution = float(text)
    except ValueError:
        raise error(f"{where}: resolution={raw!r} is not a number") from None
    if not math.isfinite(resolution) or resolution <= 0:
        raise error(f"{where}: resolution={raw}: accepted a number > 0, in the target CRS's units")
    return resolution


def check_combination(checked: Mapping[str, Any], *, where: str, error: type[BadInputError]) -> None:
    """Refuse warp options that contradict or lack each other (defaults already left out)."""
    web = checked.get("web_optimized") == "true"
    custom = [o for o in ("target_srs", "resolution") if o in checked]
    if web and custom:
        raise error(
            f"{where}: web_optimized=true with {' and '.join(custom)}: the web-optimized grid is WebMercatorQuad's "
            "at its own zoom; accepted: web_optimized, or target_srs and/or resolution"
        )
    if "warp_resampling" in checked and not (web or custom):
        raise error(
            f"{where}: warp_resampling={checked['warp_resampling']} without web_optimized=true, target_srs or "
            "resolution: nothing is warped; accepted: warp_resampling together with one of them"
        )
