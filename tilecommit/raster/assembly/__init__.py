"""Assembling a mosaic: the job's tiles as one COG, committed once and verified, with its STAC
item and quicklook.

- :mod:`.mosaic`: :func:`~.mosaic.assemble_mosaic`;
- :mod:`.checks`: the manifest complete and matching storage; a mosaic's shape and pyramid;
- :mod:`.block_copy`, :mod:`.block_sources`, :mod:`.pyramid`, :mod:`.copy_plan`: the mosaic laid
  out from the tiles' own compressed blocks (with the TIFF codec, :mod:`tilecommit.raster.tiff`);
- :mod:`.server_copy`: the storage service stages the tiles' byte ranges (Put Block From URL);
- :mod:`.staging`: bytes from this process into staged blocks, and the create-only commits;
- :mod:`.shares`: the server-side staging split over several activities;
- :mod:`.vrt`: the VRT fallback (GDAL's COG driver over local copies of the tiles);
- :mod:`.committed`: a committed mosaic verified against what the tiles make;
- :mod:`.sidecars`, :mod:`.stac`, :mod:`.footprint`: the companions, read from the committed mosaic;
- :mod:`.attempt`: what one attempt owns (its block ids, its temporary directory).

:mod:`.pyramid` and :mod:`.footprint` are here because assembly is their caller: the pyramid is
the mosaic's (it plans which tile levels the mosaic reuses), the footprint is the STAC item's.
"""
