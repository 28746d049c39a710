"""A bench-only Durable app: the REAL orchestrators with activities that do no raster work.

The app registers ``function_app.tiling_functions``, the blueprint the Functions app registers,
with :class:`NullActivities` in place of the real activities: they answer at once with results
of the shape the real ones return. So an orchestration of N windows here costs exactly what the
orchestration itself costs: replays, history, episodes, dispatch, and no pixels.
"""

from __future__ import annotations

import azure.durable_functions as df

from function_app import tiling_functions
from tilecommit.grid import Window
from tilecommit.spec import OutputSpec


class NullActivities:
    """The activities, answering at once (same names and parameters as activities.tiling)."""

    @staticmethod
    def validate_source(job: dict) -> dict:
        return {"ok": True, "scene": {"width": job["scene_width"], "height": job["scene_height"]}}

    @staticmethod
    def render_tile(payload: dict) -> dict:
        window = Window.from_dict(payload["window"])
        return {"window": window.id, "outcome": "written", "skipped": False, "nbytes": 1}

    @staticmethod
    def assemble_mosaic(payload: dict) -> dict:
        return {"outcome": "written", "mosaic_url": "", "stac_url": "", "quicklook_url": ""}

    @staticmethod
    def plan_mosaic_shares(payload: dict) -> dict:
        return {"single": "the null app assembles nothing"}

    @staticmethod
    def stage_mosaic_share(payload: dict) -> dict:
        return {"share": payload["share"], "ranges": 0, "bytes": 0, "stopped": False, "staged": 0}

    @staticmethod
    def reduce_level_node(payload: dict) -> dict:
        return {
            "stage": payload["stage"],
            "row": payload["row"],
            "col": payload["col"],
            "outcome": "written",
            "nbytes": 1,
        }

    @staticmethod
    def add_to_collection(payload: dict) -> dict:
        return {"collection": "null", "outcome": "written", "revision": 1, "conflicts": 0, "attempts": 1}

    @staticmethod
    def publish_item(payload: dict) -> dict:
        job_id = payload["job"]["job_id"]
        return {"state": "not-configured", "collection": "", "item_id": job_id, "url": "", "outcome": None}

    @staticmethod
    def publish_job_event(payload: dict) -> dict:
        return {"outcome": "not-configured", "event_id": "", "type": ""}


app = df.DFApp()
app.register_functions(tiling_functions(NullActivities, NullActivities))


def job_input(job_id: str, windows: int, *, window_size: int = 1024, batch_size: int = 64) -> dict:
    """A job input the starter would make, for a scene of (about) ``windows`` windows.

    The scene is a grid of ``cols`` x ``rows`` whole windows with cols x rows == windows when
    ``windows`` factors nicely (1,000 = 40 x 25, 10,000 = 100 x 100), else the nearest rectangle
    that holds at least ``windows``.
    """
    cols = rows = 1
    best = None
    for c in range(1, windows + 1):
        r = -(-windows // c)
        key = (c * r - windows, abs(c - r))
        if best is None or key < best[0]:
            best = (key, c, r)
        if c * c > windows * 4:
            break
    _, cols, rows = best
    return {
        "job_id": job_id,
        "blob": f"null/{job_id}.tif",
        "url": f"http://127.0.0.1/null/{job_id}.tif",
        "etag": "0x0",
        "size": 1,
        "spec": OutputSpec(window_size=window_size).to_dict(),
        "batch_size": batch_size,
        "scene_width": cols * window_size,
        "scene_height": rows * window_size,
    }
