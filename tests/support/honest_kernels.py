"""Every honest kernel file and ModelNew the project holds, for the false-refusal count of the
static check (a judge that rejects a correct kernel is as broken as one that accepts a wrong one).

- the starters of both backends;
- the correct kernels in tests/data (written unlike the starters);
- KernelBench's honest solutions in tests/data/kernelbench, and KernelBench's own few-shot example;
- the honest variants the judge's tests generate, the search loop's and the module search's files;
- complete kernel files written as string literals inside the tests (attacks and fragments aside).
"""
from __future__ import annotations

import ast

from paths import DATA, KERNELBENCH, ROOT

# KernelBench solutions that cheat (their names say how); every other one is honest
CHEATING_SOLUTIONS = ("19_ReLU_zeros", "19_ReLU_pytorch", "19_ReLU_eager_when_timed", "19_ReLU_hang",
                      "19_ReLU_inplace", "19_ReLU_late_cache", "19_ReLU_replay", "19_ReLU_segfault", "19_ReLU_wrong",
                      "96_ScaleByTiny_zeros")
# judge variants that are refused before import by design (what they do is not on the allow-list)
REFUSED_VARIANTS = ("syntax_error", "import_error", "numpy_no_launch", "calls_reference", "jitter", "unordered_sum",
                    "result_cache", "reused_output_buffer")
# tests whose kernel literals are attacks on what ships, and (file, line) of fragments
ATTACK_TESTS = ("tests/deploy/test_served_guard.py", "tests/deploy/test_load_surface.py")
NOT_KERNELS = (("tests/search/test_prompt.py", 9),)


def _backend(text: str) -> str:
    return "cuda" if 'BACKEND = "cuda"' in text or "BACKEND = 'cuda'" in text else "triton"


def _files() -> dict[str, tuple[str, str, bool]]:
    found = {}
    for path in sorted([*ROOT.glob("starter_kernels/*/*.py"), *DATA.glob("kernels/**/*.py")]):
        if path.name != "__init__.py":
            text = path.read_text()
            found[str(path.relative_to(ROOT))] = (text, _backend(text), False)
    for path in sorted([*(KERNELBENCH / "solutions").glob("*.py"), *(KERNELBENCH / "fewshot").glob("*.py")]):
        if path.stem not in CHEATING_SOLUTIONS:
            found[str(path.relative_to(ROOT))] = (path.read_text(), "triton", True)
    return found


def _generated() -> dict[str, tuple[str, str, bool]]:
    import judge_kernels
    import loop_kernels
    import module_kernels
    found = {f"judge_kernels.{name}": (text, "triton", False)
             for name, (text, _, _) in judge_kernels.VARIANTS.items() if name not in REFUSED_VARIANTS}
    for name, text in vars(loop_kernels).items():
        if isinstance(text, str) and "def kernel_fn" in text:
            found[f"loop_kernels.{name}"] = (text, "triton", False)
    for name, text in vars(module_kernels).items():
        if isinstance(text, str) and "class ModelNew" in text:
            found[f"module_kernels.{name}"] = (text, "triton", True)
    return found


def _in_tests() -> dict[str, tuple[str, str, bool]]:
    found = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        where = str(path.relative_to(ROOT))
        if path.parent.name == "attacks" or where in ATTACK_TESTS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            text = node.value
            if ("def kernel_fn" not in text and "class ModelNew" not in text) or (where, node.lineno) in NOT_KERNELS:
                continue
            try:
                ast.parse(text)
            except SyntaxError:
                continue  # a fragment
            found[f"{where}:{node.lineno}"] = (text, _backend(text), "class ModelNew" in text)
    return found


def honest_kernels() -> dict[str, tuple[str, str, bool]]:
    """name -> (text, backend, model): every honest kernel file and ModelNew."""
    return {**_files(), **_generated(), **_in_tests()}


def count_by_kind(kernels: dict[str, tuple[str, str, bool]]) -> dict[str, int]:
    kinds = {"triton": 0, "cuda": 0, "model": 0}
    for _, backend, model in kernels.values():
        kinds["model" if model else backend] += 1
    return kinds

