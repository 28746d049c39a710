"""Every Bicep file parses with tree-sitter-bicep, with zero ERROR or MISSING nodes anywhere,
and the reader in tests/bicep.py evaluates what the agreement test relies on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bicep import BROKEN_FIXTURE, INFRA, REPO_ROOT, Bicep, bicep_files, syntax_problems

TEMPLATES = bicep_files(INFRA)


def test_infra_has_its_templates() -> None:
    names = {p.relative_to(INFRA).as_posix() for p in TEMPLATES}
    assert "main.bicep" in names
    assert any(name.startswith("modules/") for name in names), names


@pytest.mark.parametrize(
    "path",
    TEMPLATES + bicep_files(BROKEN_FIXTURE),
    ids=lambda p: p.relative_to(REPO_ROOT).as_posix(),
)
def test_bicep_file_parses_without_errors(path: Path) -> None:
    assert syntax_problems(path.read_bytes()) == []


def test_every_module_reference_points_at_a_file_in_infra() -> None:
    seen = set()
    for path in TEMPLATES:
        for module in Bicep(path).modules.values():
            target = (path.parent / module.type_or_path).resolve()
            assert target.is_file(), f"{path.name}: module {module.name} -> {module.type_or_path} is missing"
            assert INFRA in target.parents
            seen.add(target)
    # Every module file is used by some template.
    assert {p.resolve() for p in TEMPLATES if p.parent.name == "modules"} <= seen


BROKEN_SNIPPETS = {
    "unclosed object": "resource st 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'x'\n",
    "property without value": "var settings = {\n  name:\n}\n",
    "unclosed string": "param location string = 'westeurope\n",
    "stray token": "var x = 1 +* 2\n",
    "missing resource type": "resource st = {\n  name: 'x'\n}\n",
    "unbalanced interpolation": "var url = 'https://${host/path'\n",
}


@pytest.mark.parametrize("snippet", BROKEN_SNIPPETS.values(), ids=BROKEN_SNIPPETS.keys())
def test_parse_check_catches_broken_bicep(snippet: str) -> None:
    assert syntax_problems(snippet.encode()) != []


def test_parse_check_accepts_valid_bicep() -> None:
    # The control for the test above: the same constructs, written correctly.
    valid = (
        "param location string = 'westeurope'\n"
        "var settings = {\n  name: 'x'\n}\n"
        "var url = 'https://${location}/path'\n"
        "resource st 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n  name: 'x'\n  location: location\n}\n"
    )
    assert syntax_problems(valid.encode()) == []


def test_reader_evaluates_what_the_agreement_test_relies_on(tmp_path: Path) -> None:
    # The evaluator is test code too: check it on a file whose answers are known.
    source = (
        "@allowed([\n  'A'\n  'B'\n])\nparam plan string = 'A'\n"
        "param n int = 64\n"
        "var isA = plan == 'A'\n"
        "var name = 'raster-uploads'\n"
        "var list = concat([\n  {\n    name: 'X'\n    value: string(n)\n  }\n], isA ? [] : [\n"
        "  {\n    name: 'Y'\n    value: '${name}/${other.prop}'\n  }\n])\n"
    )
    path = tmp_path / "reader-check.bicep"
    path.write_text(source)
    doc = Bicep(path)
    assert doc.evaluate(doc.vars["list"].value) == [{"name": "X", "value": "64"}]
    assert doc.evaluate(doc.vars["list"].value, {"plan": "B"}) == [
        {"name": "X", "value": "64"},
        {"name": "Y", "value": "raster-uploads/{other.prop}"},
    ]
    assert [doc.evaluate(a) for a in doc.params["plan"].decorators["allowed"]] == [["A", "B"]]
