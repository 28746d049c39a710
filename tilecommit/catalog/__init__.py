"""The catalog: where a finished job's STAC item is made findable (pgstac: :mod:`.pgstac`)."""
