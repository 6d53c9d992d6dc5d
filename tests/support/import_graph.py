"""The import graph of the project's own packages, read from the source (nothing is imported), and
the two rules the layout keeps: no circle, and arrows only downward through the layers."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("autokernel", "harness", "starter_kernels", "playbook")
# Top to bottom. A module may import its own package and any package below its layer; nothing in
# the same layer or above. harness/ is the judge: it sits under everything and imports none of it
# (a CUDA C++ starter calls its launcher, harness/cuda_launcher.py).
LAYERS = (
    ("autokernel.__main__",),
    ("autokernel.cli",),
    ("autokernel.display",),
    ("autokernel.kernelbench",),
    ("autokernel.deploy",),
    ("autokernel.search",),
    ("autokernel.judging", "autokernel.profile"),
    ("autokernel.errors", "autokernel"),
    ("starter_kernels", "playbook"),  # kernel files and the LLM's playbook: data the stages read
    # the judge, top to bottom: its entry point, the processes that run a candidate, KernelBench's
    # protocol, the verdict, timing, the checks of a call, confinement, device probes, compiling for a target, the CUDA
    # launcher that kernel files import, the kernel-type registry
    ("harness.__main__",),
    ("harness.judge",),
    ("harness.workers",),
    ("harness.kernelbench",),
    ("harness.verdict",),
    ("harness.timing",),
    ("harness.correctness",),
    ("harness.isolation",),
    ("harness.device",),
    ("harness.compiling",),
    ("harness.cuda_launcher",),
    ("harness.cuda_build",),
    ("harness.kernel_types",),
    ("harness",),
)


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(name: str, node: ast.ImportFrom | ast.Import, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's own package, up level - 1
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def graph(root: Path) -> dict[str, set[str]]:
    """module -> the project's modules it imports, at import time or inside a function alike."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(name, node, path.name == "__init__.py"):
                while target and target not in known:  # `from pkg import name`: name may be no module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round a loop (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def unit(name: str) -> str:
    """The layer entry a module belongs to: the longest listed prefix."""
    best = ""
    for layer in LAYERS:
        for entry in layer:
            if (name == entry or name.startswith(entry + ".")) and len(entry) > len(best):
                best = entry
    return best


def layer_of(entry: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if entry in layer)


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import that does not point down: 'a -> b (layer of a: x, of b: y)'."""
    wrong = []
    for source in sorted(edges):
        for target in sorted(edges[source]):
            a, b = unit(source), unit(target)
            if a == b:
                continue
            if not a or not b or layer_of(b) <= layer_of(a):
                wrong.append(f"{source} -> {target} ({a or 'no layer'} may not import {b or 'no layer'})")
    return wrong
