"""The documents point at tests that exist: a claim in README.md or docs/ names the test that
shows it (``test_file.py::test_name``; a name ending in "…" stands for the tests it begins)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest

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


# The README's links, commands and layout are real: files exist, make targets and the local host's
# commands and options exist, and the layout names the repository's top-level folders.

LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*)$", re.MULTILINE)
MAKE = re.compile(r"(?:`|^)make ([a-z][a-z-]*)", re.MULTILINE)
DEVHOST = re.compile(r"python -m devhost ([a-z][a-z-]*)(?![\w:-])([^\n`]*)")  # not its output ("...: message")
OPTION = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_links_of_the_documents_lead_to_files_and_headings_that_exist():
    broken = []
    for document in documents():
        for match in LINK.finditer(document.read_text()):
            target = match["target"]
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            if not file.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                anchors = {anchor_of(h) for h in HEADING.findall(file.read_text())}
                if anchor not in anchors:
                    broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_lists_every_page_of_docs():
    readme = (ROOT / "README.md").read_text()
    read_on = readme[readme.index("\n## Read on\n") :]
    listed = {m["target"] for m in LINK.finditer(read_on)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert listed == pages


def test_the_make_targets_the_documents_name_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE))
    named = {t for document in documents() for t in MAKE.findall(document.read_text())}
    assert {"demo", "test"} <= named
    assert named - targets == set()


def test_the_readme_layout_names_the_top_level_folders_and_nothing_deeper():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("\n## The repository\n") :]
    block = section[section.index("```\n") + 4 :]
    entries = [line.split()[0] for line in block[: block.index("```")].splitlines() if line.strip()]
    for entry in entries:
        assert (ROOT / entry).exists(), entry
        assert entry.count("/") <= 1 and (entry.endswith("/") or "/" not in entry), entry
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {path.split("/")[0] + "/" for path in tracked if "/" in path and not path.startswith(".")}
    assert folders - set(entries) == set(), "top-level folders the README's layout leaves out"


def devhost_help(*command: str) -> str:
    """What ``python -m devhost [COMMAND] --help`` prints, from the CLI's own parser in this process
    (a process per command cost a second of imports each)."""
    from devhost.cli_args import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    return out.getvalue()


def test_the_devhost_commands_and_options_the_documents_show_exist():
    used: dict[str, set[str]] = {}
    for document in [ROOT / "README.md", ROOT / "docs" / "running-locally.md"]:
        for command, rest in DEVHOST.findall(document.read_text()):
            used.setdefault(command, set()).update(OPTION.findall(rest.split("#")[0]))
    assert {"process", "serve", "status", "verify", "purge"} <= set(used)
    commands = set(re.search(r"\{([a-z,-]+)\}", devhost_help())[1].split(","))
    assert set(used) - commands == set()
    offered_anywhere = set()
    for command in commands:
        offered = set(OPTION.findall(devhost_help(command)))
        offered_anywhere |= offered
        assert used.get(command, set()) - offered == set(), f"python -m devhost {command}: {used[command] - offered}"
    # The options running-locally.md names in its prose (`--deliveries N`) are some command's.
    prose = set(re.findall(r"`(--[A-Za-z][\w-]*)", (ROOT / "docs" / "running-locally.md").read_text()))
    assert len(prose) > 8 and prose - offered_anywhere == set()
