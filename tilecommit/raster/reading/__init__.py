"""Reading an upload: what it may be, one version of it read byte for byte, and what it is.

- :mod:`.upload`: which files are accepted (a self-contained TIFF or NetCDF, by its first bytes) and the
  GDAL options that keep GDAL from reaching anything beside it;
- :mod:`.source`: the upload as GDAL reads it, every byte fetched at the job's version and
  counted (:class:`~.source.PinnedBlob`, :class:`~.source.LocalFile`);
- :mod:`.scene_document`: a scene document's band files stacked into one dataset (a VRT of our
  own over each member's pinned reader), :func:`~.scene_document.open_any_upload`;
- :mod:`.netcdf`: NetCDF and HDF5 uploads, read from a pinned, length-checked local copy whose
  HDF5 structure is checked before GDAL opens it (the driver cannot read through the reader);
- :mod:`.scene`: :func:`~.scene.inspect_source`, the bad-input gate, and :class:`~.scene.SceneInfo`;
- :mod:`.metadata`: what a source says about its pixels (tags, band descriptions, scales,
  colormap). It is read from the source (inspection asks it for a colormap), so it lives here,
  though its main callers carry it on: a tile's encoding, and the VRT mosaic from one tile.

Tiling and assembly read through this room (a tile reads its source window; assembly reads the
committed mosaic with the same pinned reader and compares CRSs as :mod:`.scene` does); it imports
neither of them and writes nothing (docs/architecture.md, "Layers").
"""
