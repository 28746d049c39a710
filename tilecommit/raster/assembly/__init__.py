"""Assembling a mosaic: the job's tiles as one COG, committed once and verified, with its STAC
item and quicklook.

One job's walk (:mod:`.mosaic`): what is there (one HEAD), the plan (:mod:`.manifest_check`), a
strategy builds the mosaic (:mod:`.strategy`, their one interface: :mod:`.server_strategy`,
:mod:`.blocks_strategy`, :mod:`.vrt_strategy`), and the one shared step commits and verifies it
(:mod:`.commit`: the requests are :mod:`.staging`'s, the verification :mod:`.committed`'s, the
companions :mod:`.sidecars`').

What the strategies and that step are built from:

- :mod:`.block_copy`, :mod:`.block_sources`, :mod:`.pyramid`, :mod:`.copy_plan`: the mosaic laid
  out from the tiles' own compressed blocks (in the TIFF codec, :mod:`tilecommit.raster.tiff`);
- :mod:`.server_copy`: the storage service stages the tiles' byte ranges (Put Block From URL);
- :mod:`.staging`: bytes from this process into staged blocks, and the create-only commits;
- :mod:`.shares`: the server-side staging split over several activities;
- :mod:`.checks`: a mosaic's shape and pyramid, planned, written or committed;
- :mod:`.stac`, :mod:`.footprint`: the companions' bytes, read from the committed mosaic;
- :mod:`.attempt`: what one attempt owns (its block ids, its temporary directory).

:mod:`.pyramid` and :mod:`.footprint` live here because assembly is what they serve: the pyramid
is the mosaic's (which tile levels it reuses, whether its levels are complete), the footprint
the STAC item's geometry. The room reads through :mod:`tilecommit.raster.reading` (the pinned
reader for the committed mosaic, the scene) and encodes a VRT mosaic with
:mod:`tilecommit.raster.tiling.encode`, but never renders a tile (docs/architecture.md, "Layers").
"""
