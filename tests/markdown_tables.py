"""Reading a table out of a Markdown document, for tests that check a document against the code."""

from __future__ import annotations

from pathlib import Path


def table_rows(path: Path, header: list[str]) -> list[list[str]]:
    """The body rows (cells stripped) of the first table in ``path`` whose header starts with
    ``header``; the separator row is left out. Fails when there is no such table."""
    rows, in_table = [], False
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[: len(header)] == header:
            in_table = True
        elif in_table and line.startswith("|"):
            if not set(cells[0]) <= {"-"}:
                rows.append(cells)
        elif in_table:
            break
    assert rows, f"no table with the header {header} in {path}"
    return rows
