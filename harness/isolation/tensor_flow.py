"""Which expressions of a kernel file hold tensors, read from its syntax alone.

The static check refuses a builtin that reads a tensor's values into Python (float(t), list(t),
print(t)), iteration over a tensor and unpacking one: each is compute on the host, out of sight of
the kernels the judge watches. To know a tensor it follows them, flow-insensitively, through the
file: kernel_fn's tensor parameters (the contract's) and a ModelNew forward's, what torch's
allocators and a tensor's own methods return, names and attributes they are assigned to, the
parameters of the file's functions they are passed to and what those return, and the lists,
tuples and dicts that hold them. What it cannot follow is not refused here; the integrity stage
fails any scalar read of a tensor in a checked or timed call at run time ("host compute").
"""
from __future__ import annotations

import ast

# A tensor's methods that answer with sizes, flags or addresses, not tensors.
NON_TENSOR_METHODS = frozenset({"size", "stride", "dim", "numel", "element_size", "data_ptr", "is_contiguous",
                                "storage_offset", "is_floating_point", "type", "get_device", "ndimension",
                                "nelement", "tolist", "item", "numpy"})
# ... and those answering with a sequence of tensors
SEQUENCE_METHODS = frozenset({"split", "chunk", "unbind", "tensor_split"})
# torch's names that are not tensor constructors or operators
TORCH_NON_TENSOR = frozenset({"cuda", "device", "finfo", "iinfo", "is_tensor", "is_floating_point", "Size", "dtype",
                              "version", "types", "no_grad", "inference_mode", "nn", "utils"})
ELEMENT = "__element__"
TENSOR_ATTRIBUTES = frozenset({"T", "mT", "data", "grad", "real", "imag", "weight", "bias"})


class TensorFlow:
    """`kind(expr)`: "tensor", "holder" (a list, tuple or dict holding tensors) or None."""

    def __init__(self, tree: ast.Module, imported: dict[str, str], tensor_params: dict[str, tuple[int, ...]]):
        self.imported = imported
        # name -> kind (flow- and scope-insensitive); ELEMENT stands for one element of a holder
        self.kinds: dict[str, str] = {ELEMENT: "tensor"}
        self.attributes: dict[str, str] = {}  # attribute name -> kind of what the file assigns to it
        self.returns: dict[str, str] = {}  # the file's function name -> kind of what it returns
        self.functions: dict[str, ast.FunctionDef] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
        for name, positions in tensor_params.items():
            fn = self.functions.get(name)
            if fn is not None:
                params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                for i in positions:
                    if i < len(params):
                        self.kinds[params[i]] = "tensor"
        self.tree = tree
        for _ in range(12):  # to a fixed point; a file's chains of helpers are short
            before = (dict(self.kinds), dict(self.attributes), dict(self.returns))
            self._propagate()
            if before == (self.kinds, self.attributes, self.returns):
                break

    # -- what an expression holds
    def kind(self, e: ast.AST | None) -> str | None:
        if isinstance(e, ast.Name):
            return self.kinds.get(e.id)
        if isinstance(e, ast.Attribute):
            if e.attr in TENSOR_ATTRIBUTES and self.kind(e.value) == "tensor":
                return "tensor"
            return self.attributes.get(e.attr) if not self._rooted(e) else None
        if isinstance(e, ast.Call):
            return self._call_kind(e)
        if isinstance(e, ast.Subscript):
            return "tensor" if self.kind(e.value) in ("tensor", "holder") else None
        if isinstance(e, ast.BinOp):
            return "tensor" if "tensor" in (self.kind(e.left), self.kind(e.right)) else None
        if isinstance(e, ast.UnaryOp):
            return self.kind(e.operand)
        if isinstance(e, (ast.IfExp, ast.BoolOp)):
            kinds = {self.kind(v) for v in ([e.body, e.orelse] if isinstance(e, ast.IfExp) else e.values)}
            return "tensor" if "tensor" in kinds else ("holder" if "holder" in kinds else None)
        if isinstance(e, ast.NamedExpr):
            return self.kind(e.value)
        if isinstance(e, (ast.List, ast.Tuple, ast.Set)):
            return "holder" if any(self.kind(x) for x in e.elts) else None
        if isinstance(e, ast.Dict):
            return "holder" if any(self.kind(x) for x in e.values) else None
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return "holder" if self.kind(e.elt) else None
        if isinstance(e, ast.DictComp):
            return "holder" if self.kind(e.value) else None
        if isinstance(e, ast.Starred):
            return self.kind(e.value)
        return None

    def _rooted(self, e: ast.AST) -> str | None:
        """The dotted name of a chain rooted in an import, else None."""
        parts = []
        while isinstance(e, ast.Attribute):
            parts.append(e.attr)
            e = e.value
        if isinstance(e, ast.Name) and e.id in self.imported:
            return ".".join([self.imported[e.id], *reversed(parts)])
        return None

    def _call_kind(self, e: ast.Call) -> str | None:
        func = e.func
        dotted = self._rooted(func) if isinstance(func, (ast.Attribute, ast.Name)) else None
        if dotted is not None:
            parts = dotted.split(".")
            if parts[0] == "torch" and len(parts) > 1 and parts[1] not in TORCH_NON_TENSOR:
                return "tensor"
            return None
        if isinstance(func, ast.Attribute):
            owner = self.kind(func.value)
            if owner == "tensor":
                if func.attr in SEQUENCE_METHODS:
                    return "holder"
                return None if func.attr in NON_TENSOR_METHODS else "tensor"
            if owner == "holder" and func.attr in ("get", "pop", "setdefault"):
                return "tensor"
            return self.returns.get(func.attr)  # self.helper(x)
        if isinstance(func, ast.Name):
            return self.returns.get(func.id)
        return None

    # -- one pass over the file
    def _propagate(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    self._bind(target, node.value)
            elif isinstance(node, ast.NamedExpr):
                self._bind(node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._bind_loop(node.target, node.iter)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        self._bind(item.optional_vars, item.context_expr)
            elif isinstance(node, ast.Call):
                self._pass_arguments(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and (kind := self.kind(ret.value)):
                        self._mark(self.returns, node.name, kind)

    def _mark(self, table: dict[str, str], key: str, kind: str | None) -> None:
        if kind == "tensor" or (kind == "holder" and table.get(key) != "tensor"):
            table[key] = kind

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        kind = self.kind(value)
        if isinstance(target, ast.Name):
            self._mark(self.kinds, target.id, kind)
        elif isinstance(target, ast.Attribute):
            self._mark(self.attributes, target.attr, kind)
        elif isinstance(target, ast.Subscript) and kind:
            root = target.value
            if isinstance(root, ast.Name):
                self._mark(self.kinds, root.id, "holder")
            elif isinstance(root, ast.Attribute):
                self._mark(self.attributes, root.attr, "holder")
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            for i, elt in enumerate(target.elts):
                if values is not None and i < len(values) and not isinstance(elt, ast.Starred):
                    self._bind(elt, values[i])
                elif kind == "holder":
                    self._bind(elt.value if isinstance(elt, ast.Starred) else elt, ast.Name(ELEMENT))
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value)

    def _bind_loop(self, target: ast.AST, iterable: ast.AST) -> None:
        kind = self.kind(iterable)
        if kind == "holder":
            self._bind(target, ast.Name(ELEMENT))
        elif (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name)
              and iterable.func.id in ("enumerate", "zip", "reversed", "sorted", "list", "tuple")
              and any(self.kind(a) == "holder" for a in iterable.args)):
            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            for elt in elts[1:] if iterable.func.id == "enumerate" else elts:
                self._bind(elt, ast.Name(ELEMENT))

    def _pass_arguments(self, call: ast.Call) -> None:
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        fn = self.functions.get(name) if name else None
        if isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "insert", "add", "update",
                                                              "setdefault") and any(self.kind(a) for a in call.args):
            self._bind(ast.Subscript(func.value, ast.Constant(0), ast.Store()), ast.Name(ELEMENT))
        if fn is None:
            return
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if isinstance(func, ast.Attribute) and params and params[0] in ("self", "cls"):
            params = params[1:]
        for i, arg in enumerate(call.args):
            kind = self.kind(arg)
            if isinstance(arg, ast.Starred) and kind:
                for p in params[i:]:
                    self._mark(self.kinds, p, "tensor")
            elif i < len(params):
                self._mark(self.kinds, params[i], kind)
            elif fn.args.vararg is not None and kind:
                self._mark(self.kinds, fn.args.vararg.arg, "holder")
        for kw in call.keywords:
            if kw.arg is not None:
                self._mark(self.kinds, kw.arg, self.kind(kw.value))
