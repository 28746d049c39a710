"""The documents point at tests that exist: a claim in README.md or docs/ names the test that
shows it (``test_file.py::test_name``; a name ending in "…" stands for the tests it begins)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = re.compile(r"(test_[a-z0-9_]+\.py)::(test_[A-Za-z0-9_]+)(…)?")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_test_the_documents_name_exists():
    named, missing = 0, []
    for document in documents():
        for match in REFERENCE.finditer(document.read_text()):
            module, name, prefix = match.groups()
            path = ROOT / "tests" / module
            found = defined_names(path) if path.exists() else set()
            named += 1
            if not (any(n.startswith(name) for n in found) if prefix else name in found):
                missing.append(f"{document.relative_to(ROOT)}: {match.group(0)}")
    assert named > 30  # the conformance table alone names more: the pattern still matches them
    assert not missing, "\n".join(missing)
