"""The JSON shape of the small records: activities return these dicts and Durable history stores
them, so a field renamed, dropped or reordered would change what a replay reads."""

from __future__ import annotations

import json
import math

import pytest

from tilecommit.backfill import BackfillRequest
from tilecommit.errors import FAULT, InvalidNameError, UnreadableRecordError, is_retryable, kind_of
from tilecommit.grid import Window
from tilecommit.raster import SceneInfo
from tilecommit.raster.assembly.commit import MosaicResult
from tilecommit.raster.tiling.render import TileResult

WINDOW = {"row": 1, "col": 2, "row_off": 1024, "col_off": 2048, "height": 1024, "width": 512}
TILE = {
    "window": "0001_0002",
    "outcome": "written",
    "skipped": False,
    "nbytes": 10,
    "sha256": "ab",
    "uri": "t.tif",
    "timings": {"read": 0.5},
}
MOSAIC = {
    "outcome": "written",
    "mosaic": "m.tif",
    "stac": "m.json",
    "quicklook": "m.png",
    "nbytes": 7,
    "overview_levels": 3,
    "timings": {"stream": 1.0},
    "method": "server",
    "sha256": "",
    "transfer": {"copied_by_service": 5, "sent_from_instance": 2, "staged_blocks": 3},
}
SCENE = {
    "width": 300,
    "height": 200,
    "count": 1,
    "dtype": "uint16",
    "crs": "EPSG:32633",
    "transform": [10.0, 0.0, 500000.0, 0.0, -10.0, 4600000.0],
    "nodata": "nan",
    "block_shapes": [[256, 256]],
    "driver": "GTiff",
    "descriptions": [None],
    "colorinterp": ["gray"],
    "mask": "nodata",
    "overview_resampling": "average",
    "nbytes": 1234,
    "scales": [0.01],
    "offsets": [],
    "units": ["m"],
    "acquired": "2021-03-04T10:11:12Z",
    "acquired_note": "",
}


@pytest.mark.parametrize(
    ("cls", "data"), [(Window, WINDOW), (TileResult, TILE), (MosaicResult, MOSAIC), (SceneInfo, SCENE)]
)
def test_a_record_round_trips_to_the_same_json_keys_in_the_same_order(cls, data):
    record = cls.from_dict(json.loads(json.dumps(data)))
    again = record.to_dict()
    assert json.dumps(again, allow_nan=False) == json.dumps(data, allow_nan=False)


def test_unknown_keys_are_ignored_and_missing_optional_fields_take_their_defaults():
    tile = TileResult.from_dict({**{k: v for k, v in TILE.items() if k != "timings"}, "added_later": 1})
    assert tile.timings == {}
    assert MosaicResult.from_dict({**MOSAIC, "timings": None}).timings == {}


def test_a_scene_stored_before_the_acquisition_time_was_kept_reads_as_giving_none():
    """An orchestration's history written by an earlier version has no acquisition fields."""
    older = {k: v for k, v in SCENE.items() if k not in ("acquired", "acquired_note")}
    scene = SceneInfo.from_dict(json.loads(json.dumps(older)))
    assert (scene.acquired, scene.acquired_note) == (None, "")


def test_a_missing_required_field_is_refused():
    with pytest.raises(
        UnreadableRecordError, match=r"TileResult cannot be built from \[.*'window'.*\]: .*'uri'"
    ) as refused:
        TileResult.from_dict({k: v for k, v in TILE.items() if k != "uri"})
    assert not is_retryable(refused.value) and kind_of(refused.value) == FAULT


def test_converters_normalise_what_json_carries():
    scene = SceneInfo.from_dict(
        {**SCENE, "transform": [10, 0, 500000, 0, -10, 4600000], "block_shapes": [(256.0, 256.0)]}
    )
    assert math.isnan(scene.nodata)
    assert all(isinstance(v, float) for v in scene.transform)
    assert scene.block_shapes == [[256, 256]] and isinstance(scene.block_shapes[0][0], int)
    assert Window.from_dict({k: str(v) for k, v in WINDOW.items()}) == Window(**WINDOW)


def test_a_records_own_check_keeps_its_error():
    """A field refused by the record's own check is that check's error (bad input here), not an
    unreadable record."""
    with pytest.raises(InvalidNameError):
        BackfillRequest.from_dict({"container": "Not A Container!"})
