"""How easy the code is to change, in counts: ``python -m bench.house``.

Prints, for the app's own code (not tests, benchmarks or the test kit):
- functions longer than 60 lines, and the longest;
- parameters of the library's entry points (public functions of ``tilecommit/``), the most and
  those with more than six;
- reads of the job by string key (``job["…"]``, ``job.get("…")`` and the same on ``spec``);
- places that build a storage fault directly (``StorageFaultError(``) beside the uses of the one
  builder;
- lines per page of ``docs/``.

Figures only: it asserts nothing (``tests/test_layers.py`` holds the rules the layers must keep).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ("tilecommit", "activities", "orchestrators", "client_functions", "devhost", "function_app.py")
LONG_FUNCTION = 60
MANY_PARAMETERS = 6
JOB_READ = re.compile(r"""\b(job|spec)(\[["']|\.get\(["'])""")


def app_files() -> list[Path]:
    files: list[Path] = []
    for name in APP:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def functions(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def main() -> None:
    long_functions, entry_points, job_reads, direct_faults, fault_builder = [], [], 0, 0, 0
    for path in app_files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        job_reads += len(JOB_READ.findall(text))
        direct_faults += len(re.findall(r"(?<!class )\bStorageFaultError\(", text))
        fault_builder += len(re.findall(r"(?<!def )\b(?:storage_fault|call_failed)\(", text))
        for node in functions(path):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LONG_FUNCTION:
                long_functions.append((length, f"{rel}:{node.name}"))
            if rel.startswith("tilecommit/") and not node.name.startswith("_"):
                entry_points.append((parameter_count(node), f"{rel}:{node.name}"))
    long_functions.sort(reverse=True)
    entry_points.sort(reverse=True)
    many = [e for e in entry_points if e[0] > MANY_PARAMETERS]
    print(f"functions over {LONG_FUNCTION} lines: {len(long_functions)}")
    for length, name in long_functions[:10]:
        print(f"  {length:4d}  {name}")
    print(f"library entry points: {len(entry_points)}, over {MANY_PARAMETERS} parameters: {len(many)}")
    for count, name in many[:15]:
        print(f"  {count:4d}  {name}")
    print(f"string-keyed reads of the job: {job_reads}")
    print(f"storage faults built directly: {direct_faults}; through the builder: {fault_builder}")
    print("docs lines per page:")
    for page in sorted((ROOT / "docs").glob("*.md")):
        print(f"  {len(page.read_text().splitlines()):5d}  {page.name}")


if __name__ == "__main__":
    sys.exit(main())
