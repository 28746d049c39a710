"""The heads of many TIFFs of one structure parsed once: a job's tiles, for the mosaic's layout.

A job's tiles are written by one encoder with one profile, so all interior tiles have the same
directories, tags and places in the file; they differ in their block arrays (where each block
is, how long) and in values the mosaic does not take from them (each tile's georeferencing, its
metadata). Parsing 1,600 heads one by one cost 0.1 to 0.3 ms each in Python objects (0.17 to
0.47 s at 40960², by the machine's load), and the commit step grew with the scene's area by
that much.

:func:`read_alike` parses the first head of a group in full (:func:`.tiff.read_layout`) and
finds, with one numpy comparison over all the others, those equal to it in every byte up to
the last one the parser reads, except the values of :data:`VARIABLE` tags. Such a head parses to the same
directories, the same block counts and the same place for every value, so its block arrays are
cut straight out of its bytes (one array a directory, a row a head). A head like no other is a
group of its own, parsed in full: nothing is assumed of a head that was not compared.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import tiff

#: Tags whose values may differ between the heads of one group: the block arrays, and what the
#: mosaic takes from tile 0000_0000's directories alone (georeferencing, GDAL's metadata and
#: nodata, names). Any other value (sizes, encoding, subfile types) must be the same byte for byte.
BLOCK_ARRAYS = (tiff.TILE_OFFSETS, tiff.TILE_BYTE_COUNTS)
VARIABLE = frozenset(
    {
        *BLOCK_ARRAYS,
        33550,  # ModelPixelScale
        33922,  # ModelTiepoint
        34264,  # ModelTransformation
        34735,  # GeoKeyDirectory
        34736,  # GeoDoubleParams
        34737,  # GeoAsciiParams
        42112,  # GDAL_METADATA
        tiff.GDAL_NODATA,
        269,  # DocumentName
        270,  # ImageDescription
        305,  # Software
        306,  # DateTime
    }
)
#: The types a block array is cut out as (SHORT, LONG, LONG8): one integer a block.
ARRAY_TYPES = frozenset({tiff.TYPE_SHORT, tiff.TYPE_LONG, tiff.TYPE_LONG8})
#: Groups tried at most; the heads left after that are parsed one by one (each a group of one),
#: so heads that are all different cost what parsing them costs, and not a comparison each.
MAX_TEMPLATES = 16


@dataclass
class AlikeHeads:
    """Heads parsed as one: the layout of the first (``members[0]``), every member's index among
    the heads given, and each directory's block arrays (``offsets[d][m]``: member ``m``'s block
    offsets in directory ``d``), as int64. The members' other variable values are not parsed."""

    layout: tiff.TiffLayout
    members: np.ndarray
    offsets: list[np.ndarray]
    byte_counts: list[np.ndarray]

    @classmethod
    def single(cls, layout: tiff.TiffLayout, index: int) -> AlikeHeads:
        """One head's layout as a group of one."""
        ds = layout.directories
        return cls(
            layout,
            np.array([index]),
            [np.array([d.block_offsets], dtype=np.int64).reshape(1, -1) for d in ds],
            [np.array([d.block_byte_counts], dtype=np.int64).reshape(1, -1) for d in ds],
        )


def read_alike(
    heads: Sequence[bytes], read_for: Callable[[int], Callable[[int, int], bytes] | None]
) -> list[AlikeHeads]:
    """``heads`` (each a TIFF's first bytes) in groups of one structure, every head in exactly one,
    the group of ``heads[0]`` first. ``read_for(i)`` reads what head ``i``'s directories need
    beyond it (None: nothing beyond); a head whose directories do not fit in it is a group of one."""
    groups: list[AlikeHeads] = []
    remaining = np.arange(len(heads))
    while remaining.size:
        first = int(remaining[0])
        layout = tiff.read_layout(heads[first], read_for(first))
        fixed = _fixed_bytes(layout, heads[first]) if len(groups) < MAX_TEMPLATES else None
        if fixed is None:
            groups.append(AlikeHeads.single(layout, first))
            remaining = remaining[1:]
            continue
        extent = layout.extent
        candidates = remaining[[len(heads[int(i)]) >= extent for i in remaining]]
        matrix = np.frombuffer(b"".join(heads[int(i)][:extent] for i in candidates), dtype=np.uint8)
        matrix = matrix.reshape(len(candidates), extent)
        same = (matrix[:, fixed] == matrix[0, fixed]).all(axis=1)
        groups.append(_group(layout, candidates[same], matrix[same]))
        remaining = np.setdiff1d(remaining, candidates[same], assume_unique=True)
    return groups


def _group(layout: tiff.TiffLayout, members: np.ndarray, matrix: np.ndarray) -> AlikeHeads:
    """The block arrays of every member, cut out of its bytes (``matrix``, a row a member)."""
    arrays: dict[int, list[np.ndarray]] = {code: [] for code in BLOCK_ARRAYS}
    for d in layout.directories:
        for code in BLOCK_ARRAYS:
            tag = d.tags[code]
            fmt, size = tiff._TYPES[tag.type]
            values = np.ascontiguousarray(matrix[:, tag.position : tag.position + tag.count * size])
            dtype = np.dtype(layout.byte_order + fmt)
            arrays[code].append(values.view(dtype).reshape(len(members), tag.count).astype(np.int64))
    return AlikeHeads(layout, members, arrays[tiff.TILE_OFFSETS], arrays[tiff.TILE_BYTE_COUNTS])


def _fixed_bytes(layout: tiff.TiffLayout, head: bytes) -> np.ndarray | None:
    """Which of the first ``layout.extent`` bytes of ``head`` must be equal for another head to
    parse as this one: all but the values of :data:`VARIABLE` tags. None when this layout cannot
    lead a group: a directory without both block arrays as integers, values overlapping one
    another, or a variable value overlapping the header, the ghost area or a directory's entries
    (then a difference there could change the parse)."""
    if layout.extent > len(head):
        return None
    variable = np.zeros(layout.extent, dtype=bool)
    claimed = np.zeros(layout.extent, dtype=np.int16)
    structure = np.zeros(layout.extent, dtype=bool)
    header = 16 if layout.bigtiff else 8
    structure[: header + len(layout.ghost)] = True
    count_len, entry_len, inline = (8, 20, 8) if layout.bigtiff else (2, 12, 4)
    count_format = layout.byte_order + ("Q" if layout.bigtiff else "H")
    for d in layout.directories:
        arrays = [d.tags.get(code) for code in BLOCK_ARRAYS]
        if any(tag is None or tag.position < 0 or tag.type not in ARRAY_TYPES for tag in arrays):
            return None
        (entries,) = struct.unpack_from(count_format, head, d.offset)
        structure[d.offset : d.offset + count_len + entries * entry_len + inline] = True
        for tag in d.tags.values():
            size = tag.count * tiff._TYPES[tag.type][1]
            if tag.position < 0 or tag.position + size > layout.extent:
                return None
            claimed[tag.position : tag.position + size] += 1
            if tag.code in VARIABLE:
                variable[tag.position : tag.position + size] = True
                if size <= inline:  # within its entry: the entry's other bytes stay fixed
                    structure[tag.position : tag.position + size] = False
    if (claimed > 1).any() or (structure & variable).any():
        return None
    return ~variable


__all__ = ["VARIABLE", "AlikeHeads", "read_alike"]
