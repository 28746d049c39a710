"""The catalog: each finished job's item in its collection (:mod:`.collections`, the documents'
shapes in :mod:`.documents`, which collection an upload belongs to in :mod:`.naming`), and, when
configured, published to pgstac (:mod:`.pgstac`).
"""
