"""Map tiles of the app's outputs: WebMercatorQuad XYZ tiles and TileJSON of a job's mosaic and of a
collection's mosaics, rendered with rio-tiler from the committed mosaic read through the app's own
pinned reader (docs/tiles.md).

``query`` and ``stretch`` are pure (what a request asks for, the display range of a band);
``mosaics`` opens a committed mosaic at its version and keeps it open for the next tile;
``render`` makes a tile's PNG and a TileJSON.
"""
