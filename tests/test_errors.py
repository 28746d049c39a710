"""The exception family (tilecommit/errors.py): one home for every exception class of the app and
the library, and a kind for each that decides how a failed job is worded; the failures an
orchestration ends with have theirs beside the orchestrators (orchestrators/failures.py)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from azure.core.exceptions import HttpResponseError

from tilecommit import errors
from tilecommit.errors import KINDS, error_value, kind_of

ROOT = Path(__file__).resolve().parents[1]
APP_AND_LIBRARY = ["function_app.py", "orchestrators", "client_functions", "activities", "tilecommit"]
#: A base that makes a class an exception: a builtin one (``LookupError``, ``IOError``) or ours.
EXCEPTION_BASE = re.compile(r"(Exception|Error|Failure)$")

#: The two homes: the library's errors, and how an orchestration fails (only orchestrators raise those).
HOMES = (ROOT / "tilecommit" / "errors.py", ROOT / "orchestrators" / "failures.py")

FAMILY = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.TileCommitError)]


def classes_outside_their_homes() -> list[str]:
    found = []
    for entry in APP_AND_LIBRARY:
        path = ROOT / entry
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            if file in HOMES or "__pycache__" in file.parts:
                continue
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    EXCEPTION_BASE.search(ast.unparse(base)) for base in node.bases
                ):
                    found.append(f"{file.relative_to(ROOT)}: {node.name}")
    return found


def test_every_exception_class_of_the_app_and_the_library_is_defined_in_its_home():
    assert classes_outside_their_homes() == []


@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_every_error_of_the_family_has_a_kind(cls):
    assert cls.kind in KINDS


def test_the_kinds_are_who_is_to_blame():
    assert {c.__name__ for c in FAMILY if c.kind == errors.BAD_INPUT} == {
        c.__name__ for c in FAMILY if issubclass(c, errors.BadInputError)
    }
    assert [c.__name__ for c in FAMILY if c.kind == errors.CHECK] == ["CatalogCheckError", "MosaicCheckError"]
    assert kind_of(HttpResponseError("(Unauthorized) no role")) == errors.FAULT
    assert kind_of(RuntimeError("a bug nobody foresaw")) == errors.FAULT


def test_the_error_value_carries_the_kind_type_message_and_window():
    value = error_value(errors.InvalidRasterError("truncated TIFF"), window="0000_0001")
    assert value == {
        "kind": "bad_input",
        "type": "InvalidRasterError",
        "message": "truncated TIFF",
        "window": "0000_0001",
    }
