"""The static check a candidate's text must pass before anything imports it.

Every name, attribute and call in the file must resolve to the allow-list written for kernels
(harness/isolation/kernel_surface.py): the file's own definitions, the modules and names listed
there, the attributes a kernel uses on its values, a few builtins. Anything else is refused with
its file, line and name: a private attribute (`x._typed_storage()`), a host-side method (`apply_`,
`tolist`), a builtin reading a tensor's values (`float(t)`, iteration over a tensor), a module
or a builtin that is simply not listed. CUDA C++ text in the file is held to the same idea by
harness/isolation/cuda_surface.py. The worker's identity check of its clocks and functions
(harness/isolation/tamper.py), the audit hook and the OS sandbox (harness/isolation/sandbox.py)
stand behind it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from harness.isolation import cuda_surface, kernel_surface, purity, syntax
from harness.isolation.tensor_flow import TensorFlow

# Prefixes whose submodules the running kernel may import (Triton's language imports its own)
SUBMODULE_PREFIXES = ("triton.language.",)
# the builtin that asks for an attribute by name: called directly, with a literal name
NAMED_ACCESS = frozenset({"hasattr"})
# methods a kernel file may not define: a finalizer runs when the judge drops an object, outside
# every timed and watched region
FINALIZERS = frozenset({"__del__"})


@dataclass(frozen=True)
class Violation:
    line: int
    rule: str
    detail: str

    def text(self, filename: str = "") -> str:
        where = f"{filename}:{self.line}" if filename else f"line {self.line}"
        return f"{where}: {self.rule}: {self.detail}"


def allowed_imports(backend: str = "triton", model: bool = False) -> tuple[str, ...]:
    return tuple(kernel_surface.modules(backend, model))


def submodule_prefixes(allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Packages whose every submodule a kernel may import too (harness/isolation/audit_hook.py asks at run time)."""
    return SUBMODULE_PREFIXES if "triton.language" in allowed else ()


def module_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return name in allowed


class _Checker(ast.NodeVisitor):
    def __init__(self, backend: str, model: bool):
        self.model = model
        self.modules = kernel_surface.modules(backend, model)
        self.values = kernel_surface.value_attributes(model)
        self.imported: dict[str, str] = {}  # name bound by an import -> what it names (a.b.c)
        self.own: set[str] = set()  # names the file binds
        self.own_attributes: set[str] = set()  # attributes the file defines
        self.chained: set[int] = set()  # Name nodes that begin an attribute chain
        self.inner: set[int] = set()  # Attribute nodes inside a longer chain
        self.called: set[int] = set()  # Name nodes that are the function of a call
        self.flow: TensorFlow | None = None
        self.strings: set[str] = set()  # names the file binds to a string
        self.violations: list[Violation] = []

    def flag(self, node: ast.AST, rule: str, detail: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), rule, detail))

    # -- what the file itself defines
    def collect(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.visit(node)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.own.add(node.id)
            elif isinstance(node, ast.arg):
                self.own.add(node.arg)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.own.add(node.name)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.own.add(node.name)
            elif isinstance(node, ast.Global):
                self.own.update(node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                self.own_attributes.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                self.own_attributes.update(cuda_surface.functions_defined(node.value))  # a launcher's methods
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.own_attributes.add(stmt.name)
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                    for t in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                        if isinstance(t, ast.Name):
                            self.own_attributes.add(t.id)
        # a file's own attribute may not take a name a tensor or a storage has
        self.own_attributes -= kernel_surface.tensor_attributes() - self.values
        self.flow = TensorFlow(tree, self.imported, _tensor_parameters(tree, self.model))
        for _ in range(3):  # names bound to strings, and to names bound to strings
            self.strings |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and self._stringy(n.value)
                             for t in n.targets if isinstance(t, ast.Name)}

    # -- imports: only the modules listed, only the names listed in them
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in self.modules:
                self.flag(node, "import not allowed", f"import {alias.name} (allowed: {', '.join(self.modules)})")
            bound = alias.asname or alias.name.split(".")[0]
            self.imported[bound] = alias.name if alias.asname else bound

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if alias.name == "*":
                self.flag(node, "import not allowed", f"from {module} import * hides what the file uses")
            elif module not in self.modules and full not in self.modules:
                self.flag(node, "import not allowed",
                          f"from {module} import {alias.name} (allowed: {', '.join(self.modules)})")
            else:
                self._resolve(node, full.split("."))
            self.imported[alias.asname or alias.name] = full

    # -- names: the file's own, an import, or an allowed builtin
    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name.startswith("__") and name.endswith("__"):
            self.flag(node, "private name", f"{name} is the interpreter's, not the kernel's")
        elif name in self.imported:
            if self.imported[name] in self.modules and id(node) not in self.chained and isinstance(node.ctx, ast.Load):
                # a module held in a variable or passed along hides every chain through it
                self.flag(node, "module used as a value", f"{name}: use the module's attributes by name")
        elif name in self.own:
            pass
        elif name in kernel_surface.FORMATTING_BUILTINS:
            self.flag(node, "formatting", f"{name}: a kernel never turns a value into text or looks values up by "
                                          "name (a tensor's repr reads every value on the host)")
        elif not kernel_surface.builtin_allowed(name):
            self.flag(node, "not on the kernel allow-list", f"{name} is not a builtin a kernel uses (allowed: "
                                                            f"{', '.join(sorted(kernel_surface.BUILTINS))})")
        elif name in NAMED_ACCESS and id(node) not in self.called:
            self.flag(node, f"{name} as a value", f"{name}: call it directly, with a literal name")
        elif name in kernel_surface.LITERAL_ONLY_BUILTINS and id(node) not in self.called:
            self.flag(node, "formatting", f"{name}: call it directly, with literals only")
        self.generic_visit(node)

    # -- attributes: along a chain from an import, or a value's listed (or own) attributes
    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Attribute):
            self.inner.add(id(node.value))  # the whole chain is checked once, at its outermost name
        if id(node) not in self.inner:
            parts, root = _chain(node)
            if isinstance(root, ast.Name):
                self.chained.add(id(root))
            if isinstance(root, ast.Name) and root.id in self.imported:
                rest = self._resolve(node, [*self.imported[root.id].split("."), *parts])
            else:
                rest = parts
            for attr in rest:
                self._value_attribute(node, attr, root if attr == parts[0] else None)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self._rooted_in_import(node.value):
            # rebinding another module's attribute (time.perf_counter, torch.cuda.Event) fakes the judge
            self.flag(node, "assignment to a module attribute", f"{ast.unparse(node)} belongs to an imported module")
        self.generic_visit(node)

    def _resolve(self, node: ast.AST, parts: list[str]) -> list[str]:
        """Check a dotted name rooted in an import against the modules' lists; the attributes of a
        value that remain past its last listed name."""
        i = next((i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in self.modules), 0)
        if i == 0:
            return []  # the import itself was refused
        while i < len(parts):
            base, name = ".".join(parts[:i]), parts[i]
            if base in self.modules:
                listed = kernel_surface.module_names(base, self.modules[base], self.model)
            elif base in kernel_surface.CLASSES:
                listed = kernel_surface.CLASSES[base]
            else:
                break
            if name not in listed:
                rule = "private name" if name.startswith("_") else "not on the kernel allow-list"
                self.flag(node, rule, f"{base}.{name} is not among what a kernel may use of {base}")
                return []
            i += 1
        return parts[i:]

    def _value_attribute(self, node: ast.AST, attr: str, owner: ast.AST | None) -> None:
        if attr == "__init__" and isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
            return  # super().__init__(): a ModelNew's constructor
        if (isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and attr.endswith("_launch")
                and self.imported.get(owner.func.id) == "harness.cuda_launcher.load_launcher"):
            return  # load_launcher(...).softmax_launch(...): a launch function of the file's CUDA_KERNELS
        if attr in kernel_surface.FORMATTING_ATTRIBUTES:
            template = f"{owner.value!r}" if isinstance(owner, ast.Constant) else "a string"
            self.flag(node, "formatting", f"{template}.{attr}(...) turns values into text on the host and walks "
                                          "attributes no check sees; a kernel has no text to make")
        elif attr.startswith("_"):
            self.flag(node, "private name", f".{attr}: attributes that begin with an underscore are never a "
                                            "kernel's (a storage's file writes, the interpreter's internals)")
        elif attr in self.values or attr in self.own_attributes:
            return
        elif attr in kernel_surface.TELLS:
            self.flag(node, "judge tell", f".{attr} {kernel_surface.TELLS[attr]}")
        elif attr in kernel_surface.HOST_METHODS:
            self.flag(node, "host compute", f".{attr} moves a tensor's values to the host, out of sight of "
                                            "the kernels the judge watches")
        else:
            self.flag(node, "not on the kernel allow-list", f".{attr} is not an attribute a kernel uses "
                                                            "(see playbook/rules.md)")

    # -- calls: named access, classes built at run time, builtins reading tensors
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            self.called.add(id(func))
            if func.id in NAMED_ACCESS and func.id not in self.own:
                self._named_access(node)
            elif func.id in kernel_surface.LITERAL_ONLY_BUILTINS and func.id not in self.own:
                args = [*node.args, *(k.value for k in node.keywords)]
                if not all(_literal(a) for a in args):
                    self.flag(node, "formatting", f"{ast.unparse(node)[:60]}: {func.id}() of literals only (printing "
                                                  "a value turns it into text on the host)")
            if func.id in kernel_surface.VALUE_READERS and func.id not in self.own:
                args = [*node.args, *(k.value for k in node.keywords)]
                if any(self.flow.kind(a) == "tensor" for a in args):
                    self.flag(node, "host compute", f"{ast.unparse(node)[:60]}: {func.id}() of a tensor reads its "
                                                    "values on the host; compute in a kernel")
        for arg in node.args:
            self._no_tensor_iteration(arg, arg.value if isinstance(arg, ast.Starred) else None, "unpacking")
        self.generic_visit(node)

    def _named_access(self, node: ast.Call) -> None:
        """getattr(obj, "name") is held to the rules of obj.name; a computed name to none, so refused."""
        name_arg = node.args[1] if len(node.args) > 1 else None
        if node.keywords or not node.args or isinstance(node.args[0], ast.Starred):
            self.flag(node, f"{node.func.id} with a computed name", f"{ast.unparse(node)}: name it literally")
        elif self._rooted_in_import(node.args[0]):
            self.flag(node, f"{node.func.id} on a module", f"{ast.unparse(node)}: use the attribute by name")
        elif not (isinstance(name_arg, ast.Constant) and isinstance(name_arg.value, str)):
            self.flag(node, f"{node.func.id} with a computed name", f"{ast.unparse(node)}: name it literally")
        else:
            self._value_attribute(node, name_arg.value, None)

    def _no_tensor_iteration(self, node: ast.AST, iterable: ast.AST | None, how: str) -> None:
        if iterable is not None and self.flow.kind(iterable) == "tensor":
            self.flag(node, "host compute", f"{how} {ast.unparse(iterable)[:40]} iterates over a tensor's values "
                                            "on the host; compute in a kernel")

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._no_tensor_iteration(node, node.iter, "for over")
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._no_tensor_iteration(node.iter, node.iter, "a comprehension over")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, (ast.Tuple, ast.List)) for t in node.targets):
            self._no_tensor_iteration(node, node.value, "unpacking")
        self.generic_visit(node)

    def visit_FormattedValue(self, node: ast.FormattedValue) -> None:
        # the expression inside the braces is visited as code; what turns it into text is not free
        self._no_tensor_iteration(node, node.value, "formatting")
        if node.conversion != -1 or node.format_spec is not None:
            self.flag(node, "formatting", f"{{{ast.unparse(node.value)[:40]}...}}: an f-string's conversion (!r, !s, "
                                          "!a) or format spec formats a value its own way; write {name} alone")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Mod) and self._stringy(node.left):
            self.flag(node, "formatting", f"{ast.unparse(node)[:50]}: % with a string on its left formats values "
                                          "(a tensor's repr reads every value on the host)")
        self.generic_visit(node)

    def _stringy(self, e: ast.AST) -> bool:
        """A string by its syntax: a literal, an f-string, one built from them, a name bound to one."""
        if isinstance(e, ast.Constant):
            return isinstance(e.value, (str, bytes))
        if isinstance(e, ast.JoinedStr):
            return True
        if isinstance(e, ast.BinOp):
            return self._stringy(e.left) or self._stringy(e.right)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
            return self._stringy(e.func.value)
        return isinstance(e, ast.Name) and e.id in self.strings

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in FINALIZERS:
            self.flag(node, "finalizer", f"def {node.name}: runs when the judge drops an object, outside every "
                                         "timed region")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Try(self, node: ast.Try) -> None:
        # a generator (or coroutine) suspended inside try or with runs its cleanup when it is
        # collected: a finalizer. A finally clause covers the handlers and the else clause too.
        covered = node.body + ([*node.orelse, *(s for h in node.handlers for s in h.body)] if node.finalbody else [])
        if _yields_in(covered):
            self.flag(node, "finalizer", "a yield inside try: its cleanup runs when the generator is collected")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        if _yields_in(node.body):
            self.flag(node, "finalizer", "a yield inside with: its exit runs when the generator is collected")
        self.generic_visit(node)

    visit_AsyncWith = visit_With

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        # a tensor subclass can defer or fake the work while looking like the output (KernelBench's
        # lazy-tensor check); the integrity stage wants a plain dense tensor anyway
        for base in node.bases:
            if isinstance(base, (ast.Name, ast.Attribute)) and ast.unparse(base).split(".")[-1] == "Tensor":
                self.flag(node, "tensor subclass", f"class {node.name}({ast.unparse(base)}): return plain tensors")
        self.generic_visit(node)

    def _rooted_in_import(self, node: ast.AST) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.imported


def _chain(node: ast.Attribute) -> tuple[list[str], ast.AST]:
    """(['cuda', 'Event'], Name torch) for torch.cuda.Event."""
    parts: list[str] = []
    value: ast.AST = node
    while isinstance(value, ast.Attribute):
        parts.append(value.attr)
        value = value.value
    return parts[::-1], value


def _tensor_parameters(tree: ast.Module, model: bool) -> dict[str, tuple[int, ...]]:
    """The positions of the parameters that take tensors: ModelNew.forward's (after self), and
    kernel_fn's that the contract of the file's KERNEL_TYPE gives no default (its tensors)."""
    if model:
        return {"forward": tuple(range(1, 32))}
    kernel_type = next((n.value.value for n in tree.body if isinstance(n, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "KERNEL_TYPE" for t in n.targets)
                        and isinstance(n.value, ast.Constant)), None)
    try:
        from harness.kernel_types import registry
        kt = registry.get(kernel_type)
    except ImportError:  # an exported package re-checks a judged file without the registry:
        # the file's own signatures, as judged
        return {name: _undefaulted(tree, name) for name in kernel_surface.CONTRACT_FUNCTIONS}
    except Exception:  # an unknown type fails the contract check; any tensor is still followed
        return {name: tuple(range(32)) for name in kernel_surface.CONTRACT_FUNCTIONS}
    tensors = [i for i, p in enumerate(kt.params) if p not in kt.defaults]
    return {name: tuple(range(len(lead))) + tuple(len(lead) + i for i in tensors)
            for name, lead in kernel_surface.CONTRACT_FUNCTIONS.items()}


def _undefaulted(tree: ast.Module, name: str = "kernel_fn") -> tuple[int, ...]:
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return ()
    params = fn.args.posonlyargs + fn.args.args
    return tuple(range(len(params) - len(fn.args.defaults)))


def _literal(e: ast.AST) -> bool:
    """A value written in the file: constants, and containers and operators over constants."""
    return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.List, ast.operator,
                              ast.unaryop, ast.Load)) for n in ast.walk(e))


def _yields_in(body: list[ast.stmt]) -> bool:
    """Whether these statements yield or await, not counting functions and classes defined in them."""
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await, ast.AsyncFor, ast.AsyncWith)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


# Set to "off" to judge with the filter switched off: only to test the layers behind it (the audit
# hook, the sandbox, the witness) with attacks the filter would refuse first. Read by the judging
# process and its worker before any candidate runs; a candidate cannot reach either's environment.
SWITCH = "AUTOKERNEL_STATIC_CHECK"


def enforced() -> bool:
    import os
    return os.environ.get(SWITCH, "on").lower() not in ("off", "0", "false")


def check_source(text: str, backend: str = "triton", *, model: bool = False, filename: str = "") -> list[Violation]:
    """Every violation in `text`, in line order; empty when the file may be imported (or when the
    check is switched off: SWITCH). A syntax error is left to the caller (it is reported as such)."""
    tree = syntax.parse(text, filename=filename or "<kernel>")
    if not enforced():
        return []
    tree = syntax.drop_type_annotations(tree)
    checker = _Checker(backend, model)
    checker.collect(tree)  # imports, own names and tensors first, wherever they are in the file
    checker.violations.clear()
    checker.visit(tree)
    checker.violations += [Violation(line, "CUDA host side", detail)
                           for line, detail in cuda_surface.check_file(tree, backend, model)]
    checker.violations += [Violation(*found) for found in purity.check(tree, checker.flow, checker.imported)]
    return sorted(set(checker.violations), key=lambda v: (v.line, v.rule, v.detail))


def check_file(path, *, model: bool = False) -> list[Violation]:
    """check_source of a kernel file or ModelNew on disk, its backend read from its BACKEND line:
    what verify and an exported package ask of each winner before importing it."""
    from pathlib import Path
    text = Path(path).read_text(encoding="utf-8")
    tree = syntax.parse(text, filename=str(path))
    backend = next((n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                    and any(isinstance(t, ast.Name) and t.id == "BACKEND" for t in n.targets)), "triton")
    return check_source(text, backend if backend in ("triton", "cuda") else "triton", model=model,
                        filename=Path(path).name)


def describe(violations: list[Violation], filename: str = "", limit: int = 8) -> str:
    """One line per violation, for a compile-stage verdict."""
    lines = [v.text(filename) for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"... and {len(violations) - limit} more")
    return ("the static check refused the file before import (see playbook/rules.md):\n" + "\n".join(lines))
