"""The map of docs/architecture.md ("Layers"), checked: every module of the app, the library, the local
host, the test kit and the benches belongs to a part of the table, and imports nothing its part
must never import; within each folder of the library, modules import each other without a cycle.
Imports are read with ``ast`` (every ``import`` and ``from ... import``, relative ones resolved),
so one inside a function, or under ``TYPE_CHECKING``, counts too."""

from __future__ import annotations

import ast
import fnmatch
import graphlib
from pathlib import Path

import pytest

from .markdown_tables import table_rows

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CHECKED = [
    "function_app.py",
    "orchestrators",
    "client_functions",
    "activities",
    "tilecommit",
    "devhost",
    "testkit",
    "bench",
]


def cell_items(cell: str) -> list[str]:
    return [item.strip().strip("`") for item in cell.split(",") if item.strip().strip("`")]


def the_map() -> list[tuple[str, list[str], list[str]]]:
    """(part, file patterns, module prefixes it must never import), from the table."""
    rows = table_rows(ARCHITECTURE, ["part", "files", "never imports"])
    return [(cells[0], cell_items(cells[1]), cell_items(cells[2])) for cells in rows]


def project_files() -> list[Path]:
    files = []
    for entry in CHECKED:
        path = ROOT / entry
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    # ``_generated``: protobuf modules compiled at setup (gitignored), not code anyone writes.
    return [f for f in files if "__pycache__" not in f.parts and "_generated" not in f.parts]


def imports_of(path: Path) -> set[str]:
    package = list(path.relative_to(ROOT).parent.parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            # A name imported from a package may be a module of it (``from . import storage``).
            found |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
    return found


def matches(relative: str, pattern: str) -> bool:
    """``pattern`` matches ``relative`` part by part (``*`` never crosses a ``/``)."""
    parts, wanted = relative.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True))


def parts_of(path: Path, rows) -> list[tuple[str, list[str]]]:
    relative = path.relative_to(ROOT).as_posix()
    return [(part, never) for part, patterns, never in rows if any(matches(relative, p) for p in patterns)]


def forbidden(imported: set[str], never: list[str]) -> list[str]:
    return sorted(m for m in imported for prefix in never if m == prefix or m.startswith(prefix + "."))


def test_every_module_belongs_to_a_part_of_the_map() -> None:
    rows = the_map()
    homeless = [f.relative_to(ROOT).as_posix() for f in project_files() if not parts_of(f, rows)]
    assert homeless == [], "modules no row of docs/architecture.md's map names"


@pytest.mark.parametrize("path", project_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_module_imports_what_its_part_must_never_import(path: Path) -> None:
    imported = imports_of(path)
    for part, never in parts_of(path, the_map()):
        assert forbidden(imported, never) == [], f"{path.relative_to(ROOT)} ({part})"


def test_the_check_catches_a_forbidden_import(tmp_path) -> None:
    """The control: the reader sees a relative and a nested import the rules forbid."""
    module = ROOT / "tilecommit" / "probe_for_the_layer_test.py"
    text = "from .raster import tiles\n\ndef f():\n    import azure.functions\n"
    imported = set()
    try:
        module.write_text(text)
        imported = imports_of(module)
    finally:
        module.unlink()
    assert forbidden(imported, ["azure.functions"]) == ["azure.functions"]
    assert forbidden(imported, ["tilecommit.raster"]) == ["tilecommit.raster", "tilecommit.raster.tiles"]
    assert matches("tilecommit/gates.py", "tilecommit/*.py")
    assert not matches("tilecommit/raster/tiff.py", "tilecommit/*.py")


#: The library's folders whose modules must import each other without a cycle: each module can
#: then be read, and changed, knowing only what it imports (a package's ``__init__`` is left out:
#: it gathers its modules' names and imports them all).
ACYCLIC = [
    "tilecommit",
    "tilecommit/raster",
    "tilecommit/raster/reading",
    "tilecommit/raster/tiling",
    "tilecommit/raster/assembly",
    "tilecommit/observability",
]


def module_graph(folder: Path) -> dict[str, set[str]]:
    """Each module of ``folder`` (by dotted name) and the modules of the same folder it imports."""
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for p in sorted(folder.glob("*.py"))
        if p.name != "__init__.py"
    }
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (each module followed by one it imports), or []."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


@pytest.mark.parametrize("folder", ACYCLIC)
def test_the_modules_of_a_folder_import_each_other_without_a_cycle(folder: str) -> None:
    assert import_cycle(module_graph(ROOT / folder)) == []


def test_the_check_catches_an_import_cycle() -> None:
    """The control: a cycle three modules long, as the assembly once had (block_copy -> strategy
    -> shares -> block_copy), is found; the same modules without its last edge are not a cycle."""
    cycle = {"block_copy": {"strategy"}, "strategy": {"shares"}, "shares": {"block_copy"}, "mosaic": {"shares"}}
    assert set(import_cycle(cycle)) == {"block_copy", "strategy", "shares"}
    assert import_cycle({**cycle, "shares": set()}) == []
    assert module_graph(ROOT / "tilecommit" / "raster" / "assembly")["tilecommit.raster.assembly.server_strategy"] >= {
        "tilecommit.raster.assembly.shares",
        "tilecommit.raster.assembly.strategy",
    }
