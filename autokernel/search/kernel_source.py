"""Kernel files as text: pull a kernel out of an LLM reply, read its declared literals, check and
apply a tuning configuration.

Nothing here imports or executes a kernel file: a candidate is untrusted code and only ever runs in
the judge's subprocess. Literals are read through `ast`, constraints are evaluated by a tiny
interpreter that knows arithmetic, comparisons and min/max and nothing else.
"""
from __future__ import annotations

import ast
import json
import operator
import re
from typing import Any, Iterable

from harness.isolation import syntax

LITERAL_NAMES = ("KERNEL_TYPE", "BACKEND", "TUNABLES", "CONSTRAINTS", "CONFIG")

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)[^\n`]*$")
_PYTHON_TAGS = {"python", "py", "python3", "py3"}


# ------------------------------------------------------------------ code blocks in replies
def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every closed fenced block, in order. A fence closes on a line of the
    same character at least as long as the opening one; an unclosed block (a reply cut off by the
    token limit) is not a block: its code is truncated."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, tag = opening.group(1), opening.group(2).lower()
        for j in range(i + 1, len(lines)):
            stripped = lines[j].strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                blocks.append((tag, "\n".join(lines[i + 1:j])))
                i = j + 1
                break
        else:
            break
    return blocks


def _looks_like_python(body: str) -> bool:
    """An untagged block counts when it parses as Python and defines or imports something: replies
    often show shell commands or output in untagged blocks, and those must not become a kernel."""
    try:
        tree = syntax.parse(body)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(node, (ast.FunctionDef, ast.Import, ast.ImportFrom, ast.Assign))
               for node in tree.body)


def extract_last_python_block(text: str) -> str | None:
    """The body of the last fenced python block in `text` (``` python, py, python3, or an untagged
    block that parses as Python with a definition in it); None when there is none."""
    chosen = None
    for tag, body in _fenced_blocks(text or ""):
        if tag in _PYTHON_TAGS or (not tag and _looks_like_python(body)):
            chosen = body
    if chosen is None or not chosen.strip():
        return None
    return chosen.rstrip() + "\n"


def description_of(text: str, limit: int = 160) -> str:
    """A one-line description of a reply: its first line of prose outside code blocks."""
    in_block = False
    for line in (text or "").splitlines():
        if _FENCE.match(line):
            in_block = not in_block
            continue
        words = line.strip().lstrip("#*->").replace("**", "").replace("`", "").strip()
        if not in_block and words:
            return words if len(words) <= limit else words[:limit - 3].rstrip() + "..."
    return ""


# ------------------------------------------------------------------ module-level literals
def _assignments(tree: ast.Module) -> Iterable[tuple[str, ast.stmt, ast.expr]]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            yield node.targets[0].id, node, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node, node.value


def read_literals(source: str) -> dict[str, Any]:
    """KERNEL_TYPE, BACKEND, TUNABLES, CONSTRAINTS and CONFIG as assigned at module level (the last
    assignment wins). Names that are absent are left out. Raises ValueError when the file does not
    parse or one of these names is assigned something that is not a literal."""
    try:
        tree = syntax.parse(source)
    except SyntaxError as e:
        raise ValueError(f"the kernel file does not parse: line {e.lineno}: {e.msg}") from None
    found: dict[str, Any] = {}
    for name, _, value in _assignments(tree):
        if name in LITERAL_NAMES:
            try:
                found[name] = ast.literal_eval(value)
            except ValueError:
                raise ValueError(f"{name} must be a plain literal (line {value.lineno})") from None
    return found


# ------------------------------------------------------------------ constraints
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCTIONS = {"min": min, "max": max}
# 2 ** 10 ** 10 would hang the evaluator: exponents beyond this are not tile arithmetic anyway.
MAX_EXPONENT = 64


def _evaluate(node: ast.AST, names: dict[str, Any]) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, names)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ValueError(f"constraint names {node.id!r}, which is not a tunable")
        return names[node.id]
    if isinstance(node, ast.BoolOp):
        values = (_evaluate(v, names) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, names)
        return (not value) if isinstance(node.op, ast.Not) else (-value if isinstance(node.op, ast.USub) else +value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, names), _evaluate(node.right, names)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large for a constraint")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, names)
        for op, comparator in zip(node.ops, node.comparators):
            if type(op) not in _COMPARE:
                raise ValueError(f"comparison {type(op).__name__} is not allowed in a constraint")
            right = _evaluate(comparator, names)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords and node.args):
        return _FUNCTIONS[node.func.id](*(_evaluate(a, names) for a in node.args))
    raise ValueError(f"{type(node).__name__} is not allowed in a constraint "
                     "(use names, numbers, arithmetic, comparisons, and/or/not, min, max)")


def check_constraints(constraints: str | Iterable[str] | None, config: dict[str, Any]) -> bool:
    """True when `config` satisfies every constraint expression (a string or a list of them).
    Raises ValueError for an expression that uses anything outside the small allowed grammar or a
    name missing from `config`; a division by zero counts as not satisfied."""
    if not constraints:
        return True
    for text in [constraints] if isinstance(constraints, str) else constraints:
        try:
            tree = syntax.parse(str(text).strip(), mode="eval")
        except SyntaxError as e:
            raise ValueError(f"constraint {text!r} does not parse: {e.msg}") from None
        try:
            if not _evaluate(tree, config):
                return False
        except ZeroDivisionError:
            return False
    return True


# ------------------------------------------------------------------ rewriting CONFIG
def _literal(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # double quotes, as the starters write them
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    raise ValueError(f"{value!r} cannot be written as a CONFIG literal")


def apply_config(source: str, config: dict[str, Any]) -> str:
    """`source` with its module-level CONFIG assignment replaced by `config`; every other byte is
    kept. Raises ValueError when the file has no CONFIG assignment to rewrite."""
    try:
        tree = syntax.parse(source)
    except SyntaxError as e:
        raise ValueError(f"the kernel file does not parse: line {e.lineno}: {e.msg}") from None
    values = [value for name, _, value in _assignments(tree) if name == "CONFIG"]
    if not values:
        raise ValueError("the kernel file has no module-level CONFIG assignment to rewrite")
    node = values[-1]  # only the value is replaced: an annotation or odd spacing survives
    # ast offsets count UTF-8 bytes within a line, so splice the encoded text
    data = source.encode("utf-8")
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    start = line_starts[node.lineno - 1] + node.col_offset
    end = line_starts[node.end_lineno - 1] + node.end_col_offset
    replacement = _literal(dict(config)).encode("utf-8")
    return (data[:start] + replacement + data[end:]).decode("utf-8")
