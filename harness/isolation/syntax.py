"""Parsing Python source where several threads parse at once (judge slots, LLM requests in flight).

CPython's ast module keeps one recursion counter per interpreter while it builds the tree; two
threads building trees at the same moment can leave it unbalanced, and ast.parse then raises
"SystemError: AST constructor recursion depth mismatch" for a file that is fine (CPython issues
106905 and 95185, seen here in 3.11 with two judge slots). One lock makes the parses take turns.
"""
from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)


# What a type annotation may name and still be left out of the surface check: builtin type names
# and None. Evaluated at def time it only reads the type; anything else in an annotation (a call,
# a subscript of a value) is code, and stays in the tree to be checked like any other.
TYPE_NAMES = frozenset({"int", "float", "bool", "str", "bytes", "tuple", "list", "dict", "None", "object"})


def _type_like(node) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, str)
    if isinstance(node, ast.Name):
        return node.id in TYPE_NAMES
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # int | None
        return _type_like(node.left) and _type_like(node.right)
    if isinstance(node, ast.Subscript):  # tuple[int, int]
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return _type_like(node.value) and all(_type_like(e) or isinstance(e, ast.Constant) for e in elements)
    return False


def drop_type_annotations(tree: ast.AST) -> ast.AST:
    """`tree` without its annotations that only name builtin types (`prefix: str = ""`, `-> int`):
    they read no value, and refusing `str` there would refuse honest kernels."""
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None and _type_like(node.annotation):
            node.annotation = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None \
                and _type_like(node.returns):
            node.returns = None
    return tree
