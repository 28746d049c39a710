"""NetCDF and HDF5 files for the tests and the benches, made by the app's own GDAL (its netCDF
driver, as ``gdal_translate -of netCDF`` writes them) and by h5py (HDF5 that GDAL does not
write: a plain CF file, external links, virtual datasets)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import rasterio
import rasterio.shutil
from rasterio.transform import from_origin

#: GDAL's netCDF FORMAT creation option for each kind of NetCDF file.
FORMATS = {"classic": "NC", "64bit": "NC2", "netcdf4": "NC4"}
#: The time coordinate's values (days) of a scene's steps, and their unit.
TIME_UNITS = "days since 2000-01-01"
CRS = "EPSG:32633"


def pixels(width: int, height: int, step: int) -> np.ndarray:
    """A step's int16 pixels: smooth and noisy parts, a block of nodata (-999), every value exact."""
    rows, cols = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(step)
    data = ((rows * 7 + cols * 3 + step * 100) % 3000 - 500 + rng.integers(0, 40, (height, width))).astype("int16")
    data[height // 3 : height // 3 + 17, width // 4 : width // 4 + 23] = -999
    return data


def write_netcdf(
    path: Path,
    *,
    width: int,
    height: int,
    steps: int = 3,
    kind: str = "netcdf4",
    variables: tuple[str, ...] = ("tas",),
) -> Path:
    """A CF NetCDF file of ``variables`` (int16, scale 0.01, offset 273.15, unit K, nodata -999),
    each on a UTM grid with ``steps`` time steps, written by GDAL's netCDF driver (``kind``: classic,
    64bit or netcdf4). The time coordinate is 0, 31, 59, ... days since 2000-01-01."""
    times = [31 * step - (step > 1) * 3 for step in range(steps)]
    variable = variables[0]
    profile = dict(
        driver="GTiff",
        width=width,
        height=height,
        count=steps,
        dtype="int16",
        crs=CRS,
        transform=from_origin(500000, 4000000, 30, 30),
        nodata=-999,
    )
    with tempfile.TemporaryDirectory() as workdir:
        staged = Path(workdir) / f"{variable}.tif"
        with rasterio.open(staged, "w", **profile) as dst:
            dst.update_tags(
                NETCDF_DIM_EXTRA="{time}",
                NETCDF_DIM_time_DEF=f"{{{steps},6}}",
                NETCDF_DIM_time_VALUES="{" + ",".join(map(str, times)) + "}",
                **{"time#units": TIME_UNITS, "time#calendar": "standard", "time#axis": "T"},
            )
            for band in range(1, steps + 1):
                dst.write(pixels(width, height, band - 1), band)
                dst.update_tags(
                    band,
                    NETCDF_VARNAME=variable,
                    NETCDF_DIM_time=str(times[band - 1]),
                    long_name=f"{variable} at 2 m",
                    units="K",
                )
            dst.scales = [0.01] * steps
            dst.offsets = [273.15] * steps
            dst.units = ["K"] * steps
        options = {"FORMAT": FORMATS[kind], "WRITE_BOTTOMUP": "YES"}
        if kind == "netcdf4":
            options["COMPRESS"] = "DEFLATE"
        rasterio.shutil.copy(staged, path, driver="netCDF", **options)
    if len(variables) > 1:
        add_variables(path, variables[0], variables[1:])
    return path


def add_variables(path: Path, like: str, names: tuple[str, ...]) -> None:
    """Variables ``names`` added to a netCDF-4 file, each a copy of ``like`` (its dimensions and
    attributes) with other pixels: GDAL's netCDF driver writes one variable per file."""
    import h5py

    with h5py.File(path, "r+") as file:
        for number, name in enumerate(names, start=1):
            file.copy(like, name)
            file[name][...] = file[like][...] // (number + 1)
            file[name].attrs["long_name"] = np.bytes_(f"{name} at 2 m")


#: The value every pixel of the file a hostile upload names holds: seen in a tile, it was read.
SECRET_VALUE = 7331


def write_secret_hdf5(path: Path, *, width: int, height: int) -> Path:
    """An HDF5 file of the instance's disk that an upload must never reach: ``/secret``, int16,
    every pixel :data:`SECRET_VALUE`."""
    import h5py

    with h5py.File(path, "w") as file:
        file.create_dataset("secret", data=np.full((height, width), SECRET_VALUE, dtype="int16"))
    return path


def add_external_link(path: Path, target: Path) -> Path:
    """``path`` (netCDF-4) with a member ``/elsewhere`` that is an external link to ``target``'s ``/secret``."""
    import h5py

    with h5py.File(path, "r+") as file:
        file["elsewhere"] = h5py.ExternalLink(str(target), "/secret")
    return path


def add_virtual_dataset(path: Path, target: Path, *, width: int, height: int) -> Path:
    """``path`` (netCDF-4) with a dataset ``/stolen`` that is a virtual dataset of ``target``'s ``/secret``."""
    import h5py

    layout = h5py.VirtualLayout(shape=(height, width), dtype="int16")
    layout[:] = h5py.VirtualSource(str(target), "secret", shape=(height, width))
    with h5py.File(path, "r+") as file:
        file.create_virtual_dataset("stolen", layout, fillvalue=0)
    return path


def add_external_storage(path: Path, target: Path, *, width: int, height: int) -> Path:
    """``path`` (netCDF-4) with a dataset ``/outside`` whose bytes HDF5 keeps in ``target`` (its external storage)."""
    import h5py

    with h5py.File(path, "r+") as file:
        file.create_dataset(
            "outside", shape=(height, width), dtype="int16", external=[(str(target), 0, width * height * 2)]
        )
    return path


def write_cf_hdf5(path: Path, *, width: int, height: int) -> Path:
    """A plain HDF5 file (h5py's, no netCDF-4 bookkeeping) following the CF conventions: ``sst``,
    int16 in 128² gzip chunks, on UTM zone 33N given only by CF's ``grid_mapping`` variable and the
    x / y coordinate variables (dimension scales), scale 0.01, unit degC, ``_FillValue`` -1."""
    import h5py

    with h5py.File(path, "w") as file:
        x = file.create_dataset("x", data=500000 + 15 + 30 * np.arange(width, dtype="f8"))
        y = file.create_dataset("y", data=4000000 - 15 - 30 * np.arange(height, dtype="f8"))
        for scale, axis in ((x, "x"), (y, "y")):
            scale.make_scale(axis)
            scale.attrs["standard_name"] = np.bytes_(f"projection_{axis}_coordinate")
            scale.attrs["units"] = np.bytes_("m")
        crs = file.create_dataset("crs", shape=(), dtype="i4")
        crs.attrs.update(
            grid_mapping_name=np.bytes_("transverse_mercator"),
            longitude_of_central_meridian=15.0,
            latitude_of_projection_origin=0.0,
            scale_factor_at_central_meridian=0.9996,
            false_easting=500000.0,
            false_northing=0.0,
            semi_major_axis=6378137.0,
            inverse_flattening=298.257223563,
        )
        data = pixels(width, height, 0)
        data[data == -999] = -1
        sst = file.create_dataset("sst", data=data, chunks=(128, 128), compression="gzip", fillvalue=-1)
        sst.attrs.update(
            _FillValue=np.int16(-1),
            scale_factor=0.01,
            add_offset=0.0,
            units=np.bytes_("degC"),
            grid_mapping=np.bytes_("crs"),
        )
        sst.dims[0].attach_scale(y)
        sst.dims[1].attach_scale(x)
    return path


#: A filter HDF5 does not build in (Zstandard's registered id): HDF5 would look for it as a plugin.
PLUGIN_FILTER = 32015


def add_plugin_filtered_dataset(path: Path) -> Path:
    """``path`` (netCDF-4) with a dataset ``/squeezed`` whose pipeline names :data:`PLUGIN_FILTER`
    (optional, so HDF5 lets it be written without the plugin)."""
    import h5py
    from h5py import h5d, h5p, h5s, h5t, h5z

    with h5py.File(path, "r+") as file:
        plist = h5p.create(h5p.DATASET_CREATE)
        plist.set_chunk((16, 16))
        plist.set_filter(PLUGIN_FILTER, h5z.FLAG_OPTIONAL, ())
        h5d.create(file.id, b"squeezed", h5t.NATIVE_INT16, h5s.create_simple((32, 32)), dcpl=plist)
        file["squeezed"][...] = 1
    return path
