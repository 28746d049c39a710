"""The manifest check that starts every assembly: every planned window has its row, and every
tile the size its row says. Completeness comes from the manifest, never from listing the tiles.
"""

from __future__ import annotations

from ... import storage
from ...errors import IncompleteManifestError
from ...grid import Window, plan_windows
from ...jobs import Job
from ...manifest import ManifestSummary, count_manifest
from ...storage_answers import STORAGE_ERRORS, call_failed
from ...stores import JobStores
from ..reading.scene import SceneInfo


def check_manifest(job: Job, stores: JobStores, scene: SceneInfo) -> tuple[list[Window], ManifestSummary]:
    """The planned windows and their manifest rows, or :class:`IncompleteManifestError`.

    Completeness comes from the manifest (never from listing the tiles); each row's byte count is
    then compared with its blob's stored size. The listing below only reads sizes, one request
    per 5,000 tiles instead of one HEAD per tile; a row naming a blob the listing lacks counts
    as a mismatch.
    """
    job_id, tiles = job.job_id, stores.tiles
    windows = plan_windows(scene.width, scene.height, job.spec.window_size)
    summary = count_manifest(stores.manifest, job_id)
    missing = [w.id for w in windows if w.id not in summary.entries]
    if missing:
        shown = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        raise IncompleteManifestError(
            f"job {job_id}: {len(missing)} of {len(windows)} planned windows have no manifest row: {shown}",
            missing=missing,
        )
    prefix = f"tiles/{job_id}/"
    try:
        sizes = {b.name: int(b.size) for b in tiles.list_blobs(name_starts_with=prefix)}
    except STORAGE_ERRORS as exc:
        raise call_failed("listing the sizes of", prefix, exc) from exc
    mismatched = []
    details = []
    for window in windows:
        entry = summary.entries[window.id]
        stored = sizes.get(entry.uri)
        if stored is None and not entry.uri.startswith(prefix):
            props = storage.blob_head(tiles.get_blob_client(entry.uri))
            stored = None if props is None else int(props.size)
        if stored != entry.nbytes:
            mismatched.append(window.id)
            details.append(f"{window.id} ({entry.uri}: manifest {entry.nbytes} bytes, stored {stored})")
    if mismatched:
        raise IncompleteManifestError(
            f"job {job_id}: {len(mismatched)} tiles differ in size from their manifest rows: "
            + ", ".join(details[:20]),
            mismatched=mismatched,
        )
    return windows, summary
