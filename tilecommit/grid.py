"""The window plan: a pure function of the scene size and the window size.

No rasterio import here, so orchestrator code can plan deterministically without I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import BadInputError
from .records import Record

#: ASCII digits only, matched with fullmatch ('$' would accept a final newline, \d any script's digits).
_WINDOW_ID = re.compile(r"([0-9]{4,})_([0-9]{4,})")


@dataclass(frozen=True, order=True)
class Window(Record):
    """One window of the grid: its grid position and its pixel bounds in the scene."""

    row: int
    col: int
    row_off: int
    col_off: int
    height: int
    width: int

    @property
    def id(self) -> str:
        """Stable window id, ``row_col`` zero-padded: the manifest RowKey and the tile's stem."""
        return f"{self.row:04d}_{self.col:04d}"

    JSON_IN = dict.fromkeys(("row", "col", "row_off", "col_off", "height", "width"), int)


def plan_windows(width: int, height: int, size: int) -> list[Window]:
    """A row-major grid of ``size``-pixel windows covering ``width`` x ``height``.

    Edge windows are smaller where the scene is not a multiple of ``size``.
    """
    if width <= 0 or height <= 0:
        raise BadInputError(f"cannot plan windows over a {width}x{height} scene")
    if size <= 0:
        raise BadInputError(f"window size must be positive, got {size}")
    windows = []
    for row, row_off in enumerate(range(0, height, size)):
        for col, col_off in enumerate(range(0, width, size)):
            windows.append(
                Window(
                    row=row,
                    col=col,
                    row_off=row_off,
                    col_off=col_off,
                    height=min(size, height - row_off),
                    width=min(size, width - col_off),
                )
            )
    return windows


def window_for_id(window_id: str, width: int, height: int, size: int) -> Window:
    """The window with id ``row_col`` in the plan for this scene (no need to build the whole plan)."""
    match = _WINDOW_ID.fullmatch(window_id) if isinstance(window_id, str) else None
    if not match:
        raise BadInputError(f"not a window id: {window_id!r} (expected 'RRRR_CCCC')")
    row, col = int(match.group(1)), int(match.group(2))
    row_off, col_off = row * size, col * size
    if row_off >= height or col_off >= width:
        raise BadInputError(f"window {window_id} lies outside a {width}x{height} scene at size {size}")
    return Window(row, col, row_off, col_off, min(size, height - row_off), min(size, width - col_off))
