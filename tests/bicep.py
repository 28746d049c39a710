"""A small Bicep reader for the infra tests, on tree-sitter-bicep: syntax problems, and the
declarations and values of a template (`Bicep`).

No Bicep compiler can be installed here (docs/design.md, 'Checking infra and app without Azure');
tree-sitter-bicep follows modern Bicep syntax, so a file that it parses cleanly is at least well-formed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tree_sitter_bicep
from tree_sitter import Language, Node, Parser

REPO_ROOT = Path(__file__).resolve().parents[1]
INFRA = REPO_ROOT / "infra"
BROKEN_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "infra_broken"

PARSER = Parser(Language(tree_sitter_bicep.language()))


def bicep_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.bicep"))


def syntax_problems(source: bytes) -> list[str]:
    """Every ERROR and MISSING node of the whole tree, as 'line:column: what'."""
    tree = PARSER.parse(source)
    problems = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            line, column = node.start_point
            kind = f"missing {node.type!r}" if node.is_missing else "syntax error"
            snippet = source[node.start_byte : node.end_byte][:40].decode(errors="replace")
            problems.append(f"{line + 1}:{column + 1}: {kind} {snippet!r}")
        stack.extend(node.children)
    # has_error is the parser's own summary; it must agree with the walk.
    if tree.root_node.has_error and not problems:
        problems.append("the parser reports an error that the walk did not find")
    return sorted(problems)


# ------------------------------------------------------------------------------------------------
# A small reader and evaluator for Bicep files (enough for names, literals and app settings).
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unresolved:
    """An expression that is only known at deployment time (a module output, a function...)."""

    text: str

    def __str__(self) -> str:
        return "{" + self.text + "}"


@dataclass
class Declaration:
    kind: str  # param, var, resource, module, output
    name: str
    node: Node
    value: Node | None  # default / value / body object (inside `if` or `for`)
    type_or_path: str = ""
    decorators: dict[str, list[Node]] = field(default_factory=dict)
    existing: bool = False
    condition: Node | None = None
    loop_over: Node | None = None


ESCAPES = {"\\'": "'", "\\\\": "\\", "\\n": "\n", "\\r": "\r", "\\t": "\t", "\\$": "$"}


class Bicep:
    """One Bicep file's declarations, and an evaluator for its expressions.

    `evaluate(node, params)` computes literals, strings with interpolation, arrays, objects,
    identifiers (variables and parameters, parameters taken from `params` or their defaults),
    `a ? b : c`, ==, !=, &&, ||, !, + and > on whole numbers, and a few functions (string, concat, empty, toLower, replace,
    take). Anything else (module outputs, resource properties...) becomes `Unresolved`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.source = path.read_bytes()
        self.tree = PARSER.parse(self.source)
        problems = syntax_problems(self.source)
        if problems:
            raise AssertionError(f"{path} does not parse: {problems}")
        self.params: dict[str, Declaration] = {}
        self.vars: dict[str, Declaration] = {}
        self.resources: dict[str, Declaration] = {}
        self.modules: dict[str, Declaration] = {}
        self.outputs: dict[str, Declaration] = {}
        self._read_declarations()

    # -- declarations ---------------------------------------------------------------------------

    def text(self, node: Node) -> str:
        return self.source[node.start_byte : node.end_byte].decode()

    def _read_declarations(self) -> None:
        decorators: dict[str, list[Node]] = {}
        for node in self.tree.root_node.named_children:
            if node.type == "decorators":
                for decorator in node.named_children:
                    call = decorator.named_children[0]
                    name = self.text(call.child_by_field_name("function"))
                    arguments = call.child_by_field_name("arguments")
                    decorators[name] = [a for a in arguments.named_children if a.type != "comment"]
                continue
            parts = [c for c in node.named_children if c.type != "comment"]
            if node.type == "parameter_declaration":
                name = self.text(parts[0])
                default = parts[2] if len(parts) > 2 else None
                self.params[name] = Declaration("param", name, node, default, self.text(parts[1]), decorators)
            elif node.type == "variable_declaration":
                name = self.text(parts[0])
                self.vars[name] = Declaration("var", name, node, parts[-1], decorators=decorators)
            elif node.type in ("resource_declaration", "module_declaration"):
                name = self.text(parts[0])
                declaration = Declaration(
                    node.type.split("_")[0],
                    name,
                    node,
                    None,
                    self.evaluate(parts[1]),
                    decorators,
                    existing=any(c.type == "existing" for c in node.children),
                )
                body = parts[-1]
                if body.type == "if_statement":
                    declaration.condition = body.named_children[0]
                    body = body.named_children[-1]
                if body.type == "for_statement":
                    declaration.loop_over = body.named_children[1]
                    body = body.child_by_field_name("body")
                declaration.value = body
                target = self.resources if node.type == "resource_declaration" else self.modules
                target[name] = declaration
            elif node.type == "output_declaration":
                name = self.text(parts[0])
                self.outputs[name] = Declaration("output", name, node, parts[-1], self.text(parts[1]), decorators)
            decorators = {}

    def resources_of_type(self, resource_type: str) -> list[Declaration]:
        return [r for r in self.resources.values() if r.type_or_path.split("@")[0] == resource_type]

    # -- evaluation -----------------------------------------------------------------------------

    def evaluate(self, node: Node | None, params: Mapping[str, Any] | None = None) -> Any:
        if node is None:
            return None
        params = params or {}
        kind = node.type
        if kind == "string":
            parts: list[str] = []
            for child in node.named_children:
                if child.type == "string_content":
                    parts.append(self.text(child))
                elif child.type == "escape_sequence":
                    parts.append(ESCAPES.get(self.text(child), self.text(child)))
                elif child.type == "interpolation":
                    value = self.evaluate(child.named_children[0], params)
                    parts.append(str(value).lower() if isinstance(value, bool) else str(value))
            return "".join(parts)
        if kind == "number":
            return int(self.text(node))
        if kind == "boolean":
            return self.text(node) == "true"
        if kind == "null":
            return None
        if kind == "array":
            return [self.evaluate(c, params) for c in node.named_children if c.type != "comment"]
        if kind == "object":
            result = {}
            for prop in node.named_children:
                if prop.type != "object_property":
                    continue
                key_node, value_node = [c for c in prop.named_children if c.type != "comment"][:2]
                key = self.evaluate(key_node, params) if key_node.type == "string" else self.text(key_node)
                result[str(key)] = self.evaluate(value_node, params)
            return result
        if kind == "parenthesized_expression":
            return self.evaluate(node.named_children[0], params)
        if kind == "identifier":
            name = self.text(node)
            if name in params:
                return params[name]
            if name in self.vars:
                return self.evaluate(self.vars[name].value, params)
            if name in self.params and self.params[name].value is not None:
                return self.evaluate(self.params[name].value, params)
            return Unresolved(name)
        if kind == "ternary_expression":
            condition = self.evaluate(node.child_by_field_name("condition"), params)
            if isinstance(condition, bool):
                branch = "consequence" if condition else "alternative"
                return self.evaluate(node.child_by_field_name(branch), params)
            return Unresolved(self.text(node))
        if kind == "unary_expression":
            argument = self.evaluate(node.child_by_field_name("argument"), params)
            if self.text(node.child_by_field_name("operator")) == "!" and isinstance(argument, bool):
                return not argument
            return Unresolved(self.text(node))
        if kind == "binary_expression":
            left = self.evaluate(node.child_by_field_name("left"), params)
            right = self.evaluate(node.child_by_field_name("right"), params)
            operator = self.text(node.child_by_field_name("operator"))
            if isinstance(left, Unresolved) or isinstance(right, Unresolved):
                return Unresolved(self.text(node))
            if operator == "==":
                return left == right
            if operator == "!=":
                return left != right
            if operator == "&&":
                return bool(left and right)
            if operator == "||":
                return bool(left or right)
            numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
            if numbers and operator in ("+", ">"):
                return left + right if operator == "+" else left > right
            return Unresolved(self.text(node))
        if kind == "call_expression":
            function = self.text(node.child_by_field_name("function"))
            arguments = [
                self.evaluate(a, params)
                for a in node.child_by_field_name("arguments").named_children
                if a.type != "comment"
            ]
            return self._call(function, arguments, node)
        return Unresolved(self.text(node))

    def _call(self, function: str, arguments: list[Any], node: Node) -> Any:
        if any(isinstance(a, Unresolved) for a in arguments) and function != "concat":
            return Unresolved(self.text(node))
        if function == "string" and len(arguments) == 1:
            value = arguments[0]
            return str(value).lower() if isinstance(value, bool) else str(value)
        if function == "concat":
            if all(isinstance(a, list) for a in arguments):
                return [item for a in arguments for item in a]
            return "".join(str(a) for a in arguments)
        if function == "empty" and len(arguments) == 1:
            return not arguments[0]
        if function == "toLower" and len(arguments) == 1:
            return str(arguments[0]).lower()
        if function == "replace" and len(arguments) == 3:
            return str(arguments[0]).replace(str(arguments[1]), str(arguments[2]))
        if function == "take" and len(arguments) == 2:
            return arguments[0][: arguments[1]]
        return Unresolved(self.text(node))

    def property(self, value: Any, *path: str) -> Any:
        for key in path:
            if not isinstance(value, dict) or key not in value:
                raise KeyError(f"{self.path.name}: no {'.'.join(path)}")
            value = value[key]
        return value
