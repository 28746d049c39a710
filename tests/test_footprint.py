"""The STAC footprint for any projection: off-Earth corners, poles, the antimeridian, no valid pixel.

Real CRSs through the real PROJ; the masks are the real files' own (tests/fixtures/real/), or a
plain grid where the point is a place on the Earth (the antimeridian).
"""

from __future__ import annotations

import numpy as np
import rasterio
from rasterio.crs import CRS
from rasterio.transform import from_origin
from rasterio.warp import transform_geom

from tilecommit.raster.assembly.footprint import footprint
from tilecommit.raster.assembly.stac import projection_fields

from .test_real_rasters import corpus


def real(name: str):
    with rasterio.open(corpus(name)) as src:
        return src.crs, src.dataset_mask(), src.transform


def ring_points(geometry: dict) -> np.ndarray:
    polygons = [geometry["coordinates"]] if geometry["type"] == "Polygon" else geometry["coordinates"]
    return np.array([p for polygon in polygons for ring in polygon for p in ring])


def test_geostationary_disk_keeps_its_edge_where_the_corners_have_no_position():
    crs, mask, transform = real("goes.tif")
    corners = {
        "type": "Polygon",
        "coordinates": [
            [
                transform * (0, 0),
                transform * (mask.shape[1], 0),
                transform * mask.shape[::-1],
                transform * (0, mask.shape[0]),
                transform * (0, 0),
            ]
        ],
    }
    try:
        transform_geom(crs, "EPSG:4326", corners)
        corners_have_no_position = False
    except Exception:  # noqa: BLE001 - what the old footprint did, and how it failed
        corners_have_no_position = True
    assert corners_have_no_position

    found = footprint(crs, mask, transform)
    assert found.geometry["type"] == "Polygon"
    points = ring_points(found.geometry)
    assert np.isfinite(points).all() and len(points) > 100
    assert "moved inward" in found.note
    # The visible disk of a satellite over longitude lon_0 spans about 81 degrees either side.
    lon_0 = crs.to_dict()["lon_0"]
    west, south, east, north = found.bbox
    assert west < lon_0 < east and 140 < east - west < 165 and south < -70 and north > 70


def test_polar_stereographic_footprint_is_closed_through_the_pole():
    found = footprint(*real("polar_stereographic_south.tif"))
    assert found.bbox[0] == -180.0 and found.bbox[2] == 180.0 and found.bbox[1] == -90.0
    assert -60 < found.bbox[3] < -30
    points = ring_points(found.geometry)
    assert [-180.0, -90.0] in points.tolist() and [180.0, -90.0] in points.tolist()
    assert "south pole" in found.note


def test_a_scene_across_the_antimeridian_is_split_in_two_and_its_bbox_wraps():
    # UTM zone 1N (central meridian -177): 200 km to the west of x = 300 km lies past 180 degrees.
    crs = CRS.from_epsg(32601)
    found = footprint(crs, np.full((40, 40), 255, dtype="uint8"), from_origin(100000.0, 6700000.0, 10000.0, 10000.0))
    assert found.geometry["type"] == "MultiPolygon" and "antimeridian" in found.note
    west, _, east, _ = found.bbox
    assert west > 0 > east and 170 < west < 180 and -180 < east < -170
    for polygon in found.geometry["coordinates"]:
        lons = [p[0] for p in polygon[0]]
        assert max(lons) <= 180 and min(lons) >= -180
        assert polygon[0][0] == polygon[0][-1]


def test_footprint_follows_the_valid_data_not_the_extent():
    crs, mask, transform = real("alpha.tif")
    extent = footprint(crs, np.full_like(mask, 255), transform)
    valid = footprint(crs, mask, transform)
    (w0, s0, e0, n0), (w1, s1, e1, n1) = extent.bbox, valid.bbox
    assert w0 <= w1 and s0 <= s1 and e1 <= e0 and n1 <= n0
    assert (e1 - w1) * (n1 - s1) < 0.5 * (e0 - w0) * (n0 - s0)


def test_no_valid_pixel_gives_no_geometry_and_says_so():
    found = footprint(*real("all-nodata.tif"))
    assert found.geometry is None and found.bbox is None
    assert found.note == "none: the mosaic has no valid pixel"


def test_projection_fields_name_an_epsg_code_only_when_it_is_equivalent():
    laea, _, _ = real("float_raster_with_extra_nodata.tif")
    assert laea.to_authority() == ("IGNF", "ETRS89LAEA") and laea != CRS.from_user_input("IGNF:ETRS89LAEA")
    fields = projection_fields(laea.to_wkt(version="WKT2_2019"))
    assert fields["code"] is None and CRS.from_wkt(fields["wkt2"]) == laea
    assert fields["projjson"]["type"] == "ProjectedCRS"
    polar, _, _ = real("polar_stereographic_south.tif")
    assert projection_fields(polar.to_wkt(version="WKT2_2019"))["code"] == "EPSG:3412"
