"""``make demo``: the main job end to end on the embedded default.

Starts a private Azurite and a local catalog (PostgreSQL with pgstac, and the STAC API over it:
:mod:`devhost.catalog`), makes a sample scene, uploads it and processes it through the local
host, prints the job summary, saves the mosaic, STAC item and quicklook under ``demo-output/``,
ends with the item as a STAC API search by its bbox and datetime finds it (and its collection's
MosaicJSON, where the summary names one), and stops them all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from testkit.scenes import SceneSpec, write_scene


def run_demo(args: argparse.Namespace) -> int:
    from tilecommit.settings import SETTING_WINDOW_SIZE, STORAGE_CONNECTION

    from .azurite import Azurite
    from .catalog import local_catalog
    from .durable.host import HostOptions, LocalHost
    from .session import process_file, process_summary, save_outputs

    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    scene = output / "sample-scene.tif"
    say = lambda message: print(f"demo: {message}", file=sys.stderr, flush=True)  # noqa: E731

    if not scene.exists():
        started = time.perf_counter()
        say(f"making a {args.size}x{args.size} 3-band uint16 sample scene at {scene} ...")
        write_scene(str(scene), SceneSpec(args.size, args.size, 3, "uint16"))
        say(f"sample scene ready ({scene.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - started:.1f} s)")

    with Azurite(log_path=str(output / "azurite.log")) as azurite, local_catalog(True) as stac_api:
        say(f"Azurite running on 127.0.0.1 (blob port {azurite.blob_port})")
        assert stac_api is not None  # the demo's own catalog
        say(f"PostgreSQL with pgstac running on 127.0.0.1; the STAC API on {stac_api.url}")
        os.environ[STORAGE_CONNECTION] = azurite.connection_string
        os.environ[SETTING_WINDOW_SIZE] = str(args.window_size)
        with LocalHost(HostOptions()) as host:
            windows = math.ceil(args.size / args.window_size) ** 2
            say(f"processing {scene.name}: {windows} windows of {args.window_size} px through the local host ...")
            summary = process_file(host, scene, timeout=3600, progress=True)
            summary = process_summary(host, summary, scene.name)
            if summary["status"] == "completed":
                summary["saved"] = save_outputs(host, summary, output)
                found = found_in_catalog(stac_api, output / "item.json")
    print(json.dumps(summary, indent=2))
    if summary["status"] != "completed":
        say(f"job failed: {summary.get('error')}")
        return 1
    say(
        f"done in {summary['elapsed_s']} s: {summary['written']} tiles written, {summary['already_present']} already present"
    )
    say(
        f"mosaic: {summary['saved']['mosaic.tif']}  STAC item: {summary['saved']['item.json']}  "
        f"quicklook: {summary['saved']['quicklook.png']}"
    )
    say(f"published: {json.dumps(summary.get('published'))}")
    say(f"found through the STAC API: {json.dumps(found)}")
    listed = summary.get("collection") or {}
    if listed:
        say(
            f"collection {listed['collection']!r} (revision {listed['revision']}): {listed['collection_url']}; "
            f"the MosaicJSON page listing this job's mosaic: {listed['index_blob']} (in the output container)"
        )
    return 0 if found.get("found") else 1


def found_in_catalog(stac_api, item_path: Path) -> dict:
    """The demo's item as a STAC API search by its bbox and datetime finds it."""
    item = json.loads(item_path.read_text())
    query = {"bbox": item["bbox"], "datetime": item["properties"]["datetime"], "limit": 100}
    features = stac_api.search(**query)["features"]
    match = [f for f in features if f["id"] == item["id"]]
    return {
        "search": f"POST {stac_api.url}/search {json.dumps(query)}",
        "found": bool(match),
        "matched": len(features),
        "item": next((link["href"] for link in match[0]["links"] if link["rel"] == "self"), None) if match else None,
    }
