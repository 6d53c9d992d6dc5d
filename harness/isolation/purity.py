"""The state rules of the static check: every function of a kernel file is a pure function of its
arguments, and nothing at module scope can carry a value from one call to the next.

What one call leaves behind is how a kernel tells calls apart: a counter that turns it wrong after
more calls than any verdict makes (correct when judged, wrong once served), a switch set the first
time it sees the judge, a device-side counter a Triton kernel increments. The rules close the ways
to keep one, by construction (harness/isolation/kernel_surface.py holds them in words):

- no `global` or `nonlocal`, no generator (`yield`);
- inside a function, a store through a subscript or an attribute, a `del` of one, or a call of a
  container's mutating method only on a container the call made itself: a local name bound only to
  a fresh value (a display, a comprehension, an operator's result, a builtin's or an imported
  module's call, a tensor's method), never a parameter (it may be module state passed in, or a
  mutable default), a module name or a closure's; a tensor's own element writes are watched at run
  time (harness/correctness/integrity.py);
- a module-level list, dict or set is a flat, read-only table: read by key, a read method, `len`,
  `in` or iteration, or handed to a builtin or an imported function; never aliased or handed to the
  file's own functions (so `v = TABLE; v += [1]` has nothing to extend); no mutable default, no
  container in a class body, no object of the file's own classes at module scope;
- an attribute store only as `self.<name> = ...` in the `__init__` of a class the file defines;
- at module scope (class bodies, defaults and decorators included) no tensor and no iterator
  (`map`, `filter`, `zip`, `enumerate`, `reversed`, a generator expression): a loop over a
  module-level iterator advances it, a counter without a store.
"""
from __future__ import annotations

import ast

from harness.isolation import kernel_surface

RULE = "state"
ATTRIBUTE_RULE = "attribute store"
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def check(tree: ast.Module, flow, imported: dict[str, str]) -> list[tuple[int, str, str]]:
    """(line, rule, detail) for every breach of the state rules in the file."""
    found: list[tuple[int, str, str]] = []
    module_names = _module_bindings(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            found.append((node.lineno, RULE, f"{ast.unparse(node)}: a function may not rebind what outlives its "
                                             "call; return values instead"))
        elif isinstance(node, (ast.Yield, ast.YieldFrom)):
            found.append((node.lineno, RULE, "a generator keeps its place between calls; return a list"))
        elif isinstance(node, FUNCTIONS):
            found += _Function(node, tree, flow, imported, module_names).check()
    found += _module_scope(tree, flow)
    return found


def _module_bindings(tree: ast.Module) -> dict[str, ast.AST]:
    """Names bound at module scope (and in class bodies) -> the value of their last binding."""
    bound: dict[str, ast.AST] = {}
    for node in _outside_functions(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bound[t.id] = node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            bound[node.target.id] = node.value
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            bound[node.target.id] = node.iter
    return bound


def _outside_functions(tree: ast.AST):
    """Every node evaluated at import: module and class bodies, a function's decorators and defaults."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        elif isinstance(node, ast.Lambda):
            todo += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        else:
            todo += list(ast.iter_child_nodes(node))


def _module_scope(tree: ast.Module, flow) -> list[tuple[int, str, str]]:
    found = []
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found += [(s.lineno, RULE, f"class {node.name}: a list, dict or set in a class body is shared by every "
                                       "instance and every call") for s in node.body
                      if isinstance(s, (ast.Assign, ast.AnnAssign)) and isinstance(s.value, CONTAINERS)]
        elif isinstance(node, (*FUNCTIONS,)):
            found += [(d.lineno, RULE, f"{ast.unparse(d)[:40]}: a mutable default outlives every call; use None")
                      for d in [*node.args.defaults, *node.args.kw_defaults]
                      if d is not None and any(isinstance(n, (*CONTAINERS, ast.Call)) for n in ast.walk(d))]
    for node in _outside_functions(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes:
            found.append((node.lineno, RULE, f"{ast.unparse(node)[:50]}: an object at module scope keeps state "
                                             "between calls; make it inside the function"))
        if isinstance(node, ast.GeneratorExp) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in kernel_surface.ITERATORS):
            found.append((node.lineno, RULE, f"{ast.unparse(node)[:50]}: an iterator at module scope keeps its "
                                             "place between calls; build it inside the function"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.append((node.lineno, ATTRIBUTE_RULE, f"{ast.unparse(node)}: only `self.<name> = ...` in the __init__ "
                                                       "of a class the file defines may set an attribute"))
        elif isinstance(node, ast.Call) and flow.kind(node) == "tensor":
            found.append((node.lineno, RULE, f"{ast.unparse(node)[:50]}: a tensor at module scope outlives every "
                                             "call (a device-side counter); allocate inside kernel_fn"))
    return found


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node


class _Function:
    """One function's stores and mutating calls, held to the names it made itself."""

    def __init__(self, fn, tree: ast.Module, flow, imported: dict[str, str], module_names: dict[str, ast.AST]):
        self.fn, self.flow, self.imported, self.module_names = fn, flow, imported, module_names
        args = fn.args
        self.params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        self.params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        self.classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.body = list(self._own_nodes())
        self.bindings: dict[str, list[ast.AST | None]] = {}  # local name -> values (None: a loop's, a with's)
        for node in self.body:
            self._collect(node)
        self.init_self = self._init_self(tree)
        self.owned = self._owned()

    def _own_nodes(self):
        """The function's own nodes: not those of functions or classes nested in it."""
        todo = [self.fn.body] if isinstance(self.fn, ast.Lambda) else list(self.fn.body)
        while todo:
            node = todo.pop()
            yield node
            if not isinstance(node, (*FUNCTIONS, ast.ClassDef)):
                todo += list(ast.iter_child_nodes(node))

    def _collect(self, node: ast.AST) -> None:
        pairs: list[tuple[ast.AST, ast.AST | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            pairs = [(node.target, None)]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            pairs = [(i.optional_vars, None) for i in node.items if i.optional_vars is not None]
        for target, value in pairs:
            for n in _bound_names(target):  # an unpacked element is not the fresh value itself
                self.bindings.setdefault(n.id, []).append(value if n is target else None)

    def _init_self(self, tree: ast.Module) -> str | None:
        """`self` when this function is the __init__ of a class the file defines."""
        if not isinstance(self.fn, ast.FunctionDef) or self.fn.name != "__init__" or not self.fn.args.args:
            return None
        for cls in ast.walk(tree):
            if isinstance(cls, ast.ClassDef) and self.fn in cls.body:
                return self.fn.args.args[0].arg
        return None

    def _owned(self) -> set[str]:
        """Local names bound only to values this call made, to a fixed point (b = a, a owned)."""
        owned: set[str] = set()
        while True:
            now = {name for name, values in self.bindings.items() if name not in self.params
                   and all(v is not None and self._fresh(v, owned) for v in values)}
            if now == owned:
                return owned
            owned = now

    def _fresh(self, e: ast.AST, owned: set[str]) -> bool:
        if isinstance(e, (ast.Constant, ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp, ast.DictComp,
                          ast.SetComp, ast.GeneratorExp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.JoinedStr,
                          ast.Lambda)):
            return True
        if isinstance(e, ast.Name):
            return e.id in owned
        if isinstance(e, ast.IfExp):
            return self._fresh(e.body, owned) and self._fresh(e.orelse, owned)
        if isinstance(e, ast.Call):
            func = e.func
            if isinstance(func, ast.Name):
                return func.id in kernel_surface.BUILTINS or func.id in self.imported or func.id in self.classes
            if isinstance(func, ast.Attribute):
                root = _root(func.value)
                return (self.flow.kind(func.value) == "tensor" or (isinstance(root, ast.Name) and (
                    root.id in self.imported or root.id in owned)))
        return False

    # -- the rules
    def check(self) -> list[tuple[int, str, str]]:
        found = []
        for node in self.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    found += self._store(node, t)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.comprehension)):
                targets = [i.optional_vars for i in node.items] if isinstance(node, (ast.With, ast.AsyncWith)) \
                    else [node.target]
                for t in targets:
                    found += self._store(node, t) if t is not None else []
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in kernel_surface.MUTATING_METHODS):
                found += self._mutation(node, node.func.value, f".{node.func.attr}()")
        return found + self._module_containers()

    def _module_containers(self) -> list[tuple[int, str, str]]:
        """A module-level list, dict or set is a read-only table: read by key, length or iteration,
        never handed on whole (an alias is a way to change it), and holding no container itself."""
        found, parents = [], {}
        for node in self.body:
            for child in ast.iter_child_nodes(node):
                parents[id(child)] = node
        for node in self.body:
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in self.bindings
                    and node.id not in self.params and isinstance(self.module_names.get(node.id), CONTAINERS)):
                continue
            if not _flat(self.module_names[node.id]):
                found.append((node.lineno, RULE, f"{node.id} holds containers: a function may read only a flat "
                                                 "module-level table (numbers, strings, tuples)"))
            elif not _read_only(node, parents.get(id(node)), self.imported):
                found.append((node.lineno, RULE, f"{node.id}: a module-level table is read by key (`{node.id}[k]`, "
                                                 f"`.get`), `len` or iteration, never handed on whole"))
        return found

    def _store(self, stmt: ast.AST, target: ast.AST) -> list[tuple[int, str, str]]:
        found = []
        for t in _store_targets(target):
            if isinstance(t, ast.Attribute):
                if not (self.init_self and isinstance(t.value, ast.Name) and t.value.id == self.init_self):
                    found.append((stmt.lineno, ATTRIBUTE_RULE,
                                  f"{ast.unparse(t)}: only `self.<name> = ...` in the __init__ of a class the file "
                                  "defines may set an attribute (a class's method replaced, state kept on an object)"))
            elif isinstance(t, ast.Subscript) and self.flow.kind(t.value) != "tensor":
                found += self._mutation(stmt, t.value, f"{ast.unparse(t)[:40]} =")
        return found

    def _mutation(self, node: ast.AST, receiver: ast.AST, what: str) -> list[tuple[int, str, str]]:
        root = _root(receiver)
        if isinstance(root, ast.Name) and root.id in self.owned:
            return []
        if isinstance(root, CONTAINERS):
            return []
        name = ast.unparse(root)[:30]
        return [(node.lineno, RULE, f"{what} changes {name}, which this call did not make (module state, a "
                                    "parameter or a closure's): a kernel keeps nothing between calls")]

CONTAINERS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
READ_METHODS = frozenset({"get", "items", "keys", "values", "index", "count"})


def _flat(value: ast.AST) -> bool:
    """A display whose items are immutable: constants, names, attributes, tuples and operators of them."""
    if not isinstance(value, (ast.Dict, ast.List, ast.Set)):
        return False
    items = [*value.values, *(k for k in value.keys if k is not None)] if isinstance(value, ast.Dict) else value.elts
    return all(not isinstance(n, (*CONTAINERS, ast.Call, ast.Lambda, ast.GeneratorExp)) for i in items
               for n in ast.walk(i))


def _read_only(node: ast.Name, parent: ast.AST | None, imported: dict[str, str]) -> bool:
    """Read by key, a read method, iteration or `in`; or handed to a builtin or an imported function
    (`dict(CONFIG)`, `load_launcher(CUDA_KERNELS, CONFIG)`), which keep nothing of the file's."""
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return True  # a store through it is the store rule's
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return parent.attr in READ_METHODS | kernel_surface.MUTATING_METHODS  # a mutation: the mutation rule's
    if isinstance(parent, ast.Call) and node is not parent.func:
        root = _root(parent.func)
        return isinstance(root, ast.Name) and (root.id in imported or (
            root is parent.func and root.id in kernel_surface.BUILTINS))
    if isinstance(parent, ast.Compare) and node in parent.comparators:
        return all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
    return isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is node


def _bound_names(target: ast.AST):
    """The names a target binds (`a`, `a, *b`); not those inside a subscript or attribute it stores to."""
    if isinstance(target, ast.Name):
        yield target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


def _store_targets(target: ast.AST):
    if isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _store_targets(elt)
    elif isinstance(target, ast.Starred):
        yield from _store_targets(target.value)
    elif isinstance(target, (ast.Attribute, ast.Subscript)):
        yield target


def _op(op: ast.operator) -> str:
    return ast.unparse(ast.BinOp(ast.Name("a"), op, ast.Name("b")))[2:-2]
