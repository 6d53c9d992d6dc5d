"""Level-1 problems whose forward is one of our kernel types, and the ModelNew that runs that type's
Triton starter.

A problem matches when Model.forward is a single `return` of a recognised op: torch.softmax /
F.softmax / an nn.Softmax attribute (softmax), torch.matmul / torch.mm / `@` (matmul),
torch.sum / x.sum over one dim (reduce), an nn.LayerNorm attribute (layernorm),
F.cross_entropy(logits, targets) (cross_entropy). The generated solution is self-contained: the
starter's source verbatim (so the tuner can rewrite its CONFIG line), the problem's imports and
Model class, and `class ModelNew(Model)` whose forward calls kernel_fn. Subclassing Model keeps
__init__ exactly (same parameters, same random initialisation, same attribute names).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from harness.isolation import syntax

SOFTMAX = {"torch.softmax", "F.softmax", "torch.nn.functional.softmax", "nn.functional.softmax",
           "torch.special.softmax"}
MATMUL = {"torch.matmul", "torch.mm"}
SUM = {"torch.sum"}
CROSS_ENTROPY = {"F.cross_entropy", "torch.nn.functional.cross_entropy", "nn.functional.cross_entropy"}
MODULES = {"nn.LayerNorm": "layernorm", "torch.nn.LayerNorm": "layernorm",
           "nn.Softmax": "softmax", "torch.nn.Softmax": "softmax"}

HELPERS = {
    "on_last_dim": '''
def _on_last_dim(fn, x, dim):
    """fn works on the last dim: move `dim` there and back (views; contiguous copies the data)."""
    dim = dim % x.dim()
    return fn(x.movedim(dim, -1).contiguous()).movedim(-1, dim)
''',
    "matmul": '''
def _matmul(fn, a, b):
    """a @ b for a 2-D b: a's leading dims are rows of one 2-D product."""
    if b.dim() != 2 or a.dim() < 2:
        raise ValueError(f"this adapter handles a @ b with a 2-D b, got {tuple(a.shape)} @ {tuple(b.shape)}")
    return fn(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
''',
    "reduce": '''
def _sum_dim(fn, x, dim, keepdim=False):
    """fn sums the last dim: move `dim` there, sum, and put it back when keepdim."""
    dim = dim % x.dim()
    y = fn(x.movedim(dim, -1).contiguous())
    return y.unsqueeze(dim) if keepdim else y
''',
    "layernorm": '''
def _layer_norm(fn, ln, x):
    """nn.LayerNorm over its normalized_shape is a layer norm over those dims flattened into one."""
    n = math.prod(ln.normalized_shape)
    w = ln.weight.reshape(-1) if ln.weight is not None else x.new_ones(n)
    b = ln.bias.reshape(-1) if ln.bias is not None else x.new_zeros(n)
    return fn(x.reshape(-1, n), w, b, ln.eps).reshape(x.shape)
''',
}


@dataclass(frozen=True)
class Match:
    kernel_type: str
    params: tuple[str, ...]  # forward's parameters after self
    body: str  # the adapter's return expression
    helper: str | None = None  # key of HELPERS


def _name(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:
        return ""


def _arg(call: ast.Call, pos: int, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[pos] if len(call.args) > pos else None


def _model_class(tree: ast.Module) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)


def _module_attrs(cls: ast.ClassDef) -> dict[str, str]:
    """self.<attr> = nn.X(...) assignments in __init__: attr -> our kernel type."""
    attrs = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            kind = MODULES.get(_name(node.value.func))
            for target in node.targets:
                if kind and isinstance(target, ast.Attribute) and _name(target.value) == "self":
                    attrs[target.attr] = kind
    return attrs


def _forward_return(cls: ast.ClassDef) -> tuple[tuple[str, ...], ast.AST] | None:
    fwd = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if fwd is None or fwd.args.vararg or fwd.args.kwarg:
        return None
    body = [s for s in fwd.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    return tuple(a.arg for a in fwd.args.args[1:]), body[0].value


def match_problem(source: str) -> Match | None:
    """The kernel type a problem's forward is, with the adapter that calls its starter; None when
    the forward is anything else (the LLM agent handles those)."""
    try:
        tree = syntax.parse(source)
    except SyntaxError:
        return None
    cls = _model_class(tree)
    found = _forward_return(cls) if cls else None
    if found is None:
        return None
    params, expr = found
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.MatMult):
        return Match("matmul", params, f"_matmul(kernel_fn, {_name(expr.left)}, {_name(expr.right)})", "matmul")
    if not isinstance(expr, ast.Call):
        return None
    return _match_call(expr, params, _module_attrs(cls))


def _match_call(call: ast.Call, params: tuple[str, ...], attrs: dict[str, str]) -> Match | None:
    func = _name(call.func)
    keywords = {kw.arg for kw in call.keywords}
    if func in SOFTMAX and keywords <= {"dim"} and _arg(call, 1, "dim") is not None:
        x, dim = _arg(call, 0, "input"), _arg(call, 1, "dim")
        return Match("softmax", params, f"_on_last_dim(kernel_fn, {_name(x)}, {_name(dim)})", "on_last_dim")
    if func in MATMUL and len(call.args) == 2 and not call.keywords:
        a, b = call.args
        return Match("matmul", params, f"_matmul(kernel_fn, {_name(a)}, {_name(b)})", "matmul")
    is_method_sum = isinstance(call.func, ast.Attribute) and call.func.attr == "sum" and func not in SUM
    if (func in SUM or is_method_sum) and keywords <= {"dim", "keepdim"}:
        shift = 0 if is_method_sum else 1
        x = call.func.value if is_method_sum else _arg(call, 0, "input")
        dim, keepdim = _arg(call, shift, "dim"), _arg(call, shift + 1, "keepdim")
        if dim is None or isinstance(dim, (ast.List, ast.Tuple)):
            return None
        keep = _name(keepdim) if keepdim is not None else "False"
        return Match("reduce", params, f"_sum_dim(kernel_fn, {_name(x)}, {_name(dim)}, {keep})", "reduce")
    if func in CROSS_ENTROPY and len(call.args) == 2 and not call.keywords:
        return Match("cross_entropy", params, f"kernel_fn({_name(call.args[0])}, {_name(call.args[1])})")
    if isinstance(call.func, ast.Attribute) and _name(call.func.value) == "self" and len(call.args) == 1:
        kind = attrs.get(call.func.attr)
        x, module = _name(call.args[0]), f"self.{call.func.attr}"
        if kind == "layernorm":
            return Match("layernorm", params, f"_layer_norm(kernel_fn, {module}, {x})", "layernorm")
        if kind == "softmax":
            return Match("softmax", params, f"_on_last_dim(kernel_fn, {x}, {module}.dim)", "on_last_dim")
    return None


def wrap_starter(problem_source: str, match: Match, starter_source: str) -> str:
    """A self-contained ModelNew file: the starter verbatim, then Model and the adapter."""
    tree = syntax.parse(problem_source)
    fixed = ["import math", "import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    imports = [ast.get_source_segment(problem_source, n) for n in tree.body
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    imports = [i for i in dict.fromkeys(imports) if i not in fixed]
    model = ast.get_source_segment(problem_source, _model_class(tree))
    params = ", ".join(("self",) + match.params)
    parts = [starter_source.rstrip(), "",
             "# ---- KernelBench adapter (generated) " + "-" * 60,
             "# ModelNew is the problem's Model (same __init__: same parameters, same random",
             "# initialisation) whose forward runs kernel_fn above instead of PyTorch's op.",
             *fixed, *imports, "", "", model, "",
             HELPERS[match.helper].rstrip() if match.helper else "", "", "",
             "class ModelNew(Model):",
             f"    def forward({params}):",
             f"        return {match.body}", ""]
    return "\n".join(parts)
