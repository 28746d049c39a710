"""Making a tile: one window of the upload as a COG tile, committed once.

- :mod:`.encode`: what a tile's bytes are (the window read exactly, the COG options, the encoding),
  with no storage in it; the VRT assembly and the scrub encode with the same functions;
- :mod:`.render`: :func:`~.render.render_tile`, the activity's step: the manifest's point read,
  the window encoded, the create-only commit, then the manifest row.

It reads the upload through :mod:`tilecommit.raster.reading` and never imports the assembly.
"""
