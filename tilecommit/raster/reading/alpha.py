"""A source's alpha band: when GDAL takes it as the valid area, and what the profile options may do with it.

``rio cogeo create`` (rio-cogeo 7.0.4, ``cog_translate``) reads every source through rasterio's
WarpedVRT, which declares a band whose colour interpretation is alpha to GDAL's warper as the
source's and the output's alpha (``SrcAlphaBand``, ``DstAlphaBand``). With ``--add-mask`` it drops
that band and writes the WarpedVRT's mask, which is that band as warped, into a 1-bit mask: valid
where it is above 0. With ``--web-optimized`` it keeps the band, as the warper writes it.

This build does the same, both built on the alpha band GDAL takes as the valid area
(:func:`alpha_band`), with nothing else that says what is valid. The rest is refused at validation
with the reason (:func:`check_alpha_options`): there rio-cogeo's result rests on rasterio's guess
of a mask from several (the alpha band's nodata mask for RGBA, the union of every band's for
grey + alpha, valid pixels moved off the nodata value by the warper), or, for an alpha band GDAL
does not take as a mask (int16, float), on a warped alpha band its mask then ignores.
"""

from __future__ import annotations

from rasterio.enums import ColorInterp, MaskFlags

from ... import profiles
from ...errors import UnsupportedRasterError

#: What ``web_optimized``, ``target_srs`` and ``resolution`` are called in messages.
WARP = "the warp (web_optimized, target_srs, resolution)"


def alpha_band(src) -> int | None:
    """The band GDAL takes as ``src``'s valid area, or None: GDAL's mask flags say alpha for the
    last of 2 or 4 bands of uint8 or uint16 data with an alpha colour interpretation, when no
    nodata value or internal mask says otherwise."""
    return src.count if any(MaskFlags.alpha in flags for flags in src.mask_flag_enums) else None


def has_alpha_colour(src) -> bool:
    """Whether a band of ``src`` says it is alpha (how rio-cogeo and rasterio find an alpha band)."""
    return any(ci == ColorInterp.alpha for ci in src.colorinterp)


def check_alpha_options(path: str, src, choice: profiles.Choice, mask_kind: str) -> None:
    """Refuse ``add_mask`` or a warp on a source with an alpha band where the result is not built
    (the module's notes); ``mask_kind`` is how the source carries its validity (SceneInfo.mask)."""
    if not has_alpha_colour(src) or not (choice.add_mask or choice.warped):
        return
    option = "add_mask" if choice.add_mask else WARP
    if mask_kind == "alpha" and choice.nodata is not None:
        raise UnsupportedRasterError(
            f"{path} carries its valid area as an alpha band, and the profile's nodata={choice.nodata:g} would "
            f"mark no data besides: with both and {option}, rio cogeo create takes the mask from rasterio's guess "
            "(the alpha band's nodata mask for RGBA, every band's for grey + alpha) and moves valid pixels off the "
            f"value, which is not built; accepted: {option} on this source without the nodata option"
        )
    if not choice.add_mask or mask_kind == "alpha":
        return  # a warp of what GDAL does not take as an alpha mask warps that band as any other
    if src.nodata is not None:
        raise UnsupportedRasterError(
            f"{path} has an alpha band and a nodata value ({src.nodata:g}), which GDAL takes as its valid area "
            "instead: add_mask would make the mask of both as rio cogeo create --add-mask does, from rasterio's "
            "guess (the alpha band's nodata mask for RGBA, every band's for grey + alpha), which is not built; "
            "accepted: add_mask on this source without its nodata value (the alpha band becomes the mask), or "
            "this source without add_mask"
        )
    alpha = next(band for band, ci in enumerate(src.colorinterp, start=1) if ci == ColorInterp.alpha)
    besides = ", an internal mask besides" if mask_kind == "per-dataset" else ""
    raise UnsupportedRasterError(
        f"{path} has an alpha band that GDAL does not take as its valid area (band {alpha} of {src.count}, "
        f"{src.dtypes[0]}{besides}): it takes the last "
        "of 2 or 4 bands of uint8 or uint16 data, with no nodata value or internal mask; rio cogeo create "
        "--add-mask would drop the band and write a mask that ignores it; accepted: this source without add_mask"
    )
