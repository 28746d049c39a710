"""``make demo``: the main job end to end on the embedded default.

Starts a private Azurite, makes a sample scene, uploads it and processes it through the local
host, prints the job summary, saves the mosaic, STAC item and quicklook under ``demo-output/``,
and stops Azurite.
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

    with Azurite(log_path=str(output / "azurite.log")) as azurite:
        say(f"Azurite running on 127.0.0.1 (blob port {azurite.blob_port})")
        os.environ[STORAGE_CONNECTION] = azurite.connection_string
        os.environ[SETTING_WINDOW_SIZE] = str(args.window_size)
        with LocalHost(HostOptions()) as host:
            windows = math.ceil(args.size / args.window_size) ** 2
            say(f"processing {scene.name}: {windows} windows of {args.window_size} px through the local host ...")
            summary = process_file(host, scene, timeout=3600, progress=True)
            summary = process_summary(host, summary, scene.name)
            if summary["status"] == "completed":
                summary["saved"] = save_outputs(host, summary, output)
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
    return 0
