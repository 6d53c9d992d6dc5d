"""The static check a candidate's text must pass before anything imports it.

A kernel needs torch, Triton and a little of the standard library; it never needs the file system,
the interpreter's internals or another module's globals. Each rule below blocks a way to reach
the judge's clocks or records from inside the candidate's process, checked on the syntax tree so a
violation costs nothing to find and names its line. The check cannot see everything a running
program can reach (an attribute chain through an allowed module); the worker's identity check of
its clocks and functions (harness/isolation/tamper.py) and the OS sandbox (harness/isolation/sandbox.py) stand behind it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from harness.isolation import kernel_surface, syntax

# What a kernel file may import: the kernel languages and pure helpers of the standard library.
# triton.tools.tensor_descriptor is the host side of Hopper's TMA: a plain descriptor of a tensor.
KERNEL_IMPORTS = ("torch", *kernel_surface.TORCH_MODULES, "triton", "triton.language",
                  "triton.tools.tensor_descriptor", "math", "functools", "typing", "dataclasses", "__future__")
# A CUDA C++ kernel builds and launches through the project's loaders, which cache and observe it:
# the launch library (harness.cuda_launcher) or a torch extension (harness.cuda_build).
CUDA_IMPORTS = ("harness.cuda_launcher", "harness.cuda_build")
# A KernelBench ModelNew is an nn.Module and may build CUDA C++ with load_inline.
MODEL_IMPORTS = kernel_surface.MODEL_MODULES
# Prefixes whose submodules are kernel language too (libdevice lives in triton.language.extra).
SUBMODULE_PREFIXES = ("triton.language.",)

# Names that reach the interpreter, the file system or other modules' globals: with any of them a
# candidate can rebind the judge's clock, rewrite sys.modules or write the run's records.
FORBIDDEN_NAMES = frozenset({
    "sys", "builtins", "__builtins__", "ctypes", "gc", "inspect", "importlib", "os", "subprocess",
    "open", "exec", "eval", "compile", "__import__", "__dict__", "__globals__", "__code__",
    "globals", "locals", "vars", "breakpoint", "setattr", "delattr",
    "__subclasses__", "__bases__", "__mro__", "__closure__", "__getattribute__", "__loader__", "__spec__",
    "memoryview", "__build_class__",
})
# Attribute names that stay forbidden after a dot: `torch.os`, `fn.__globals__`. Not `compile`:
# torch.compile and a Triton object's .compile are not the builtin.
FORBIDDEN_ATTRIBUTES = FORBIDDEN_NAMES - {"compile", "open", "exec", "eval", "globals", "locals", "vars",
                                          "breakpoint", "setattr", "delattr"}
# ... and, on any object, what serializes, reads or writes files: a tensor's storage from a file,
# a numpy array written out or pickled, a pickle or marshal module reached through another's
SERIALIZING_ATTRIBUTES = frozenset({"from_file", "tofile", "dump", "dumps", "loads", "pickle", "marshal",
                                    "_pickle", "cPickle", "shelve",
                                    # and a running frame, reached from a traceback or a generator
                                    "tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals",
                                    "f_globals",
                                    # work handed to another stream, finishing after the timed region
                                    # (KernelBench's stream check), and a lazy tensor's constructor
                                    "wait_stream", "record_stream", "_make_subclass"})
# ... and what moves a tensor's values to Python or numpy to compute there, out of sight of every
# check of what a call did with PyTorch and launched (a scalar's .item() stays: sizes and flags);
# a tensor's storage reads as bytes without a single PyTorch op
HOST_ATTRIBUTES = frozenset({"numpy", "tolist", "from_numpy", "frombuffer", "from_dlpack", "to_dlpack",
                             "untyped_storage", "storage"})
# the builtins that read or set any attribute by name: called directly, never passed as a value
# (functools.reduce(getattr, ...) would hide the name from the rules on attributes)
NAMED_ACCESS = frozenset({"getattr", "hasattr"})
# methods a kernel file may not define: a finalizer runs when the judge drops an object, outside
# every timed and watched region
FINALIZERS = frozenset({"__del__"})


def attribute_refusal(attr: str) -> tuple[str, str] | None:
    """(rule, why) when `obj.attr` (or getattr(obj, "attr")) is refused on any object, else None."""
    if attr in FORBIDDEN_ATTRIBUTES or attr in SERIALIZING_ATTRIBUTES:
        return "forbidden name", f".{attr} reaches outside a kernel's business"
    if attr.startswith("__") and attr.endswith("__") and attr not in kernel_surface.DUNDERS:
        return "forbidden name", f".{attr} walks out of the kernel's own objects"
    if attr in HOST_ATTRIBUTES:
        return "compute on the host", f".{attr} moves tensor values out of torch and the kernel's launches"
    return None


@dataclass(frozen=True)
class Violation:
    line: int
    rule: str
    detail: str

    def text(self, filename: str = "") -> str:
        where = f"{filename}:{self.line}" if filename else f"line {self.line}"
        return f"{where}: {self.rule}: {self.detail}"


def allowed_imports(backend: str = "triton", model: bool = False) -> tuple[str, ...]:
    extra = CUDA_IMPORTS if backend == "cuda" or model else ()
    return KERNEL_IMPORTS + extra + (MODEL_IMPORTS if model else ())


def submodule_prefixes(allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Packages whose every submodule a kernel may import too (harness/isolation/audit_hook.py asks at run time)."""
    return SUBMODULE_PREFIXES if "triton.language" in allowed else ()


def module_allowed(name: str, allowed: tuple[str, ...]) -> bool:
    return name in allowed or name.startswith(submodule_prefixes(allowed))


class _Checker(ast.NodeVisitor):
    def __init__(self, allowed: tuple[str, ...]):
        self.allowed = allowed
        self.imported: dict[str, str] = {}  # name bound by an import -> what it names (a.b.c)
        self.modules: set[str] = set()  # ... those of them that name a module
        self.chained: set[int] = set()  # Name nodes that begin an attribute chain
        self.inner: set[int] = set()  # Attribute nodes inside a longer chain
        self.called: set[int] = set()  # Name nodes that are the function of a call
        self.violations: list[Violation] = []

    def flag(self, node: ast.AST, rule: str, detail: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), rule, detail))

    # -- imports: only what a kernel needs
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not module_allowed(alias.name, self.allowed):
                self.flag(node, "import not allowed", f"import {alias.name} (allowed: {', '.join(self.allowed)})")
            bound = alias.asname or alias.name.split(".")[0]
            self.imported[bound] = alias.name if alias.asname else bound
            self.modules.add(bound)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if alias.name == "*":
                self.flag(node, "import not allowed", f"from {module} import * hides what the file uses")
            elif not (module_allowed(module, self.allowed) or module_allowed(full, self.allowed)):
                self.flag(node, "import not allowed",
                          f"from {module} import {alias.name} (allowed: {', '.join(self.allowed)})")
            else:
                self._reference(node, full.lstrip("."))
            bound = alias.asname or alias.name
            self.imported[bound] = full
            if module_allowed(full, self.allowed) or kernel_surface.is_module(full):
                self.modules.add(bound)

    # -- the interpreter's back doors
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.flag(node, "forbidden name", f"{node.id} reaches outside a kernel's business")
        elif node.id in NAMED_ACCESS and id(node) not in self.called:
            self.flag(node, f"{node.id} as a value", f"{node.id}: call it directly, with a literal name")
        elif node.id == "type" and id(node) not in self.called and isinstance(node.ctx, ast.Load):
            self.flag(node, "type as a value", "type: call type(obj) directly; classes are written as class statements")
        elif node.id in self.modules and id(node) not in self.chained and isinstance(node.ctx, ast.Load):
            # a module held in a variable or passed along hides every chain through it from this check
            self.flag(node, "module used as a value", f"{node.id}: use the module's attributes by name")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        refused = attribute_refusal(node.attr)
        if refused is not None:
            self.flag(node, *refused)
        if isinstance(node.value, ast.Attribute):
            self.inner.add(id(node.value))  # the whole chain is checked once, at its outermost name
        dotted = self._dotted(node) if id(node) not in self.inner else None
        if dotted is not None:
            self._reference(node, dotted)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self._rooted_in_import(node.value):
            # rebinding another module's attribute (time.perf_counter, torch.cuda.Event) fakes the judge
            self.flag(node, "assignment to a module attribute",
                      f"{ast.unparse(node)} belongs to an imported module")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name):
            self.called.add(id(node.func))
            if node.func.id in NAMED_ACCESS:
                self._named_access(node)
            elif node.func.id == "type" and (len(node.args) != 1 or node.keywords):
                # type(name, bases, namespace) builds a class from a namespace with computed keys
                self.flag(node, "class built at run time", f"{ast.unparse(node)}: write a class statement")
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
        elif name_arg.value in FORBIDDEN_NAMES:
            self.flag(node, "forbidden name", f"{node.func.id}(..., {name_arg.value!r}) reaches outside a kernel's business")
        else:
            refused = attribute_refusal(name_arg.value)
            if refused is not None:
                self.flag(node, refused[0], f"{node.func.id}(..., {name_arg.value!r}): {refused[1]}")

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

    def _dotted(self, node: ast.Attribute) -> str | None:
        """`torch.cuda.Event` for a chain of names rooted in an import (the root marked as chained)."""
        parts: list[str] = []
        value: ast.AST = node
        while isinstance(value, ast.Attribute):
            parts.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name):
            self.chained.add(id(value))
        if not (isinstance(value, ast.Name) and value.id in self.imported):
            return None
        return ".".join([self.imported[value.id], *reversed(parts)])

    def _reference(self, node: ast.AST, dotted: str) -> None:
        why = kernel_surface.refusal(dotted, self.allowed, module_allowed)
        if why:
            self.flag(node, "not on the kernel allow-list", why)

    def _rooted_in_import(self, node: ast.AST) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.imported


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
    if not enforced():
        syntax.parse(text, filename=filename or "<kernel>")
        return []
    tree = syntax.parse(text, filename=filename or "<kernel>")
    checker = _Checker(allowed_imports(backend, model))
    # imports first, wherever they are: an attribute store may precede the import in the file
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            checker.visit(node)
    checker.violations.clear()
    checker.visit(tree)
    return sorted(set(checker.violations), key=lambda v: (v.line, v.rule, v.detail))


def describe(violations: list[Violation], filename: str = "", limit: int = 8) -> str:
    """One line per violation, for a compile-stage verdict."""
    lines = [v.text(filename) for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"... and {len(violations) - limit} more")
    return ("the static check refused the file before import (see playbook/rules.md):\n" + "\n".join(lines))
