"""What a source says about its pixels, carried into every tile and so into the mosaic.

The mosaic's block-copy paths copy its tags from a tile's directories (``tiff.copyable_tags``),
and the VRT path copies them from a tile onto the VRT, so a tile that carries the source's
metadata is all it takes for every path. What is carried is what ``rio cogeo create`` carries
(rio-cogeo 7.0.4, ``cogeo.cog_translate`` with ``forward_band_tags`` and ``forward_ns_tags``):

- the dataset's tags in the default domain (``AREA_OR_POINT`` among them, the raster type: a
  point raster whose tiles said ``Area`` would move by half a pixel for every reader);
- the tags of every other domain but ``IMAGE_STRUCTURE`` (the encoding's own: compression,
  interleave, which the tile's profile decides) and ``DERIVED_SUBDATASETS`` (views GDAL derives),
  as rio-cogeo skips them, and ``rio_creation_kwds`` (the source's own encoding again); ``xml:`` domains hold documents, not key=value tags, and are not
  written by rio-cogeo either (``update_tags`` takes key=value pairs only). GDAL's COG driver,
  which encodes the tile from the dataset they are set on, then keeps only the domains it copies
  by default: ``IMAGERY`` (the acquisition time, kept in the STAC item instead) is left behind;
- per band: description (for a NetCDF variable's time or level step, its coordinate value:
  :func:`descriptions_of`), tags (the source's statistics among them: the mosaic's pixels are the
  source's), scale and offset, unit, colour interpretation; and the colormap of band 1 (the only
  one a GeoTIFF keeps).

Nodata, the mask and the alpha band are pixels, not tags: the tile encoder writes them with the data.
An alpha band that ``add_mask`` turns into the mask is dropped, and what was said of it with it.
"""

from __future__ import annotations

from rasterio.enums import ColorInterp

#: Domains that describe the encoding, not the data, or views GDAL derives (rio-cogeo skips the
#: first two; its output lacks the third as well): ``rio_creation_kwds`` is rasterio's record of
#: the creation options the source file was written with.
SKIPPED_DOMAINS = ("IMAGE_STRUCTURE", "DERIVED_SUBDATASETS", "rio_creation_kwds")


def carried_domains(src) -> list[str]:
    """The tag domains of ``src`` (besides the default one) that travel with its pixels."""
    return [ns for ns in src.tag_namespaces() if ns not in SKIPPED_DOMAINS and not ns.startswith("xml:")]


def descriptions_of(src) -> list[str | None]:
    """Each band's description: its own; for a band GDAL's netCDF driver made of a step of a
    variable's extra dimension (time, level), none of its own, so the coordinate value and its
    unit: ``time=31 days since 2000-01-01`` (``, `` between several dimensions). The driver keeps
    them as ``NETCDF_DIM_EXTRA={time}``, ``time#units`` and the band's ``NETCDF_DIM_time``;
    ``gdal_translate -of COG`` and ``rio cogeo create`` keep those tags and leave the
    description empty, so the bands would be nameless in a STAC item. A variable with no extra
    dimension (one band) is named by its name (the band's ``NETCDF_VARNAME``)."""
    tags = src.tags()
    extra = [dim for dim in tags.get("NETCDF_DIM_EXTRA", "").strip("{}").split(",") if dim]
    described = []
    for band in src.indexes:
        own = src.descriptions[band - 1]
        band_tags = {} if own or src.driver != "netCDF" else src.tags(band)
        steps = [
            " ".join(filter(None, (f"{dim}={band_tags[f'NETCDF_DIM_{dim}']}", tags.get(f"{dim}#units"))))
            for dim in extra
            if f"NETCDF_DIM_{dim}" in band_tags
        ]
        described.append(own or ", ".join(steps) or (None if extra else band_tags.get("NETCDF_VARNAME")))
    return described


def has_colormap(src) -> bool:
    try:
        src.colormap(1)
    except ValueError:
        return False
    return True


def colour_interpretations(src, bands: list[int]) -> list[ColorInterp]:
    """The colour interpretations of ``src``'s ``bands`` where they are the outputs' bands: their
    own; one band left of several (an alpha band dropped into the mask) is grey unless it is
    paletted, as rio-cogeo sets a single output band. A format that says nothing of colour (the
    netCDF driver's bands are all undefined) gets what a GeoTIFF of it holds, and what
    ``gdal_translate -of COG`` makes: its first band grey (TIFF's PHOTOMETRIC=MINISBLACK)."""
    own = [src.colorinterp[band - 1] for band in bands]
    if len(bands) == 1 < src.count and own[0] != ColorInterp.palette:
        return [ColorInterp.gray]
    if src.driver == "netCDF" and own and own[0] == ColorInterp.undefined:
        return [ColorInterp.gray, *own[1:]]
    return own


def carry(src, dst, bands: list[int] | None = None) -> None:
    """Write what ``src`` says about its pixels onto ``dst`` (open for writing), whose bands are
    ``src``'s ``bands`` (all of them when None)."""
    bands = list(src.indexes) if bands is None else bands
    tags = src.tags()
    if tags:
        dst.update_tags(**tags)
    for ns in carried_domains(src):
        domain = src.tags(ns=ns)
        if domain:
            dst.update_tags(ns=ns, **domain)
    dst.colorinterp = colour_interpretations(src, bands)
    descriptions = descriptions_of(src)
    for written, band in enumerate(bands, start=1):
        if descriptions[band - 1]:
            dst.set_band_description(written, descriptions[band - 1])
        band_tags = src.tags(band)
        if band_tags:
            dst.update_tags(written, **band_tags)
    scales, offsets = [src.scales[b - 1] for b in bands], [src.offsets[b - 1] for b in bands]
    if any(scale != 1.0 for scale in scales) or any(offset != 0.0 for offset in offsets):
        dst.scales = scales
        dst.offsets = offsets
    units = [src.units[b - 1] for b in bands]
    if any(units):
        dst.units = units
    if has_colormap(src):
        dst.write_colormap(1, src.colormap(1))


def carried_sizes(src) -> dict[str, int]:
    """Bytes of each free-text item :func:`carry` carries (name and value, UTF-8), by a label for
    messages: what the tiles' and the mosaic's heads grow by. The numbers (scales, offsets, colour
    interpretations) and the colormap, whose size the format fixes, are left out."""
    sizes: dict[str, int] = {}

    def count(label: str, items: dict) -> None:
        for name, value in items.items():
            sizes[f"{label}{name}"] = len(str(name).encode()) + len(str(value).encode())

    count("", src.tags())
    for ns in carried_domains(src):
        count(f"domain {ns}: ", src.tags(ns=ns))
    descriptions = descriptions_of(src)
    for band in src.indexes:
        count(f"band {band} tag ", src.tags(band))
        for what, value in (("description", descriptions[band - 1]), ("unit", src.units[band - 1])):
            if value:
                sizes[f"band {band} {what}"] = len(value.encode())
    return sizes


def said(src) -> dict:
    """What :func:`carry` carries, as plain values: two datasets that say the same compare equal."""
    return {
        "tags": src.tags(),
        "domains": {ns: src.tags(ns=ns) for ns in carried_domains(src)},
        "band_tags": [src.tags(band) for band in src.indexes],
        "descriptions": descriptions_of(src),
        "scales": list(src.scales),
        "offsets": list(src.offsets),
        "units": list(src.units),
        "colorinterp": [c.name for c in src.colorinterp],
        "colormap": src.colormap(1) if has_colormap(src) else None,
    }
