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
- per band: description, tags (the source's statistics among them: the mosaic's pixels are the
  source's), scale and offset, unit, colour interpretation; and the colormap of band 1 (the only
  one a GeoTIFF keeps).

Nodata, the mask and the alpha band are pixels, not tags: the tile encoder writes them with the data.
"""

from __future__ import annotations

#: Domains that describe the encoding, not the data, or views GDAL derives (rio-cogeo skips the
#: first two; its output lacks the third as well): ``rio_creation_kwds`` is rasterio's record of
#: the creation options the source file was written with.
SKIPPED_DOMAINS = ("IMAGE_STRUCTURE", "DERIVED_SUBDATASETS", "rio_creation_kwds")


def carried_domains(src) -> list[str]:
    """The tag domains of ``src`` (besides the default one) that travel with its pixels."""
    return [ns for ns in src.tag_namespaces() if ns not in SKIPPED_DOMAINS and not ns.startswith("xml:")]


def has_colormap(src) -> bool:
    try:
        src.colormap(1)
    except ValueError:
        return False
    return True


def carry(src, dst) -> None:
    """Write what ``src`` says about its pixels onto ``dst`` (open for writing, same band count)."""
    tags = src.tags()
    if tags:
        dst.update_tags(**tags)
    for ns in carried_domains(src):
        domain = src.tags(ns=ns)
        if domain:
            dst.update_tags(ns=ns, **domain)
    dst.colorinterp = src.colorinterp
    for band in src.indexes:
        if src.descriptions[band - 1]:
            dst.set_band_description(band, src.descriptions[band - 1])
        band_tags = src.tags(band)
        if band_tags:
            dst.update_tags(band, **band_tags)
    if any(scale != 1.0 for scale in src.scales) or any(offset != 0.0 for offset in src.offsets):
        dst.scales = src.scales
        dst.offsets = src.offsets
    if any(src.units):
        dst.units = src.units
    if has_colormap(src):
        dst.write_colormap(1, src.colormap(1))


def said(src) -> dict:
    """What :func:`carry` carries, as plain values: two datasets that say the same compare equal."""
    return {
        "tags": src.tags(),
        "domains": {ns: src.tags(ns=ns) for ns in carried_domains(src)},
        "band_tags": [src.tags(band) for band in src.indexes],
        "descriptions": list(src.descriptions),
        "scales": list(src.scales),
        "offsets": list(src.offsets),
        "units": list(src.units),
        "colorinterp": [c.name for c in src.colorinterp],
        "colormap": src.colormap(1) if has_colormap(src) else None,
    }
