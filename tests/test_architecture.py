"""The layout keeps its two rules (no import circle; arrows only down: CLI -> stages -> judge), and
the checker that says so finds a circle or an upward arrow planted in a copy of the tree."""
import ast
import re
import shutil
from pathlib import Path

import pytest

import import_graph
from paths import ROOT

STAGES = ("profile", "search", "judging", "deploy", "kernelbench")


def test_no_import_circle_anywhere_in_the_project():
    assert import_graph.circles(import_graph.graph(ROOT)) == []


def test_every_import_points_down_the_layers():
    assert import_graph.upward(import_graph.graph(ROOT)) == []


def test_every_module_belongs_to_a_layer():
    assert [name for name in import_graph.modules(ROOT) if not import_graph.unit(name)] == []


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_says_what_it_takes_gives_and_where_to_start(stage):
    package = ROOT / "autokernel" / stage
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert len(doc.splitlines()) >= 3, f"autokernel/{stage}/__init__.py says too little"
    named = set(re.findall(r"\b([a-z_]+)\.py\b", doc))
    assert named, f"autokernel/{stage}/__init__.py names no module to open"
    missing = [m for m in named if not (package / f"{m}.py").exists() and not list(ROOT.glob(f"autokernel/*/{m}.py"))]
    assert missing == [], f"autokernel/{stage}/__init__.py names modules that do not exist"


@pytest.fixture
def tree(tmp_path):
    for package in import_graph.PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted():\n    {line}\n", encoding="utf-8")


def test_a_planted_circle_is_found(tree):
    # the loop imports the run folder; the run folder importing the loop (even lazily) closes a circle
    _plant(tree / "autokernel" / "search" / "run.py", "from autokernel.search import loop")
    found = import_graph.circles(import_graph.graph(tree))
    assert any({"autokernel.search.loop", "autokernel.search.run"} <= set(c) for c in found)


def test_an_upward_import_and_a_judge_that_imports_the_agent_are_found(tree):
    _plant(tree / "autokernel" / "profile" / "plan.py", "from autokernel.deploy import verify")
    _plant(tree / "harness" / "timing" / "timer.py", "import autokernel.errors")
    wrong = import_graph.upward(import_graph.graph(tree))
    assert any(w.startswith("autokernel.profile.plan -> autokernel.deploy.verify") for w in wrong)
    assert any(w.startswith("harness.timing.timer -> autokernel.errors") for w in wrong)
    assert {w.split(" -> ")[0] for w in wrong} == {"autokernel.profile.plan", "harness.timing.timer"}


HARNESS_PACKAGES = sorted(p.parent.name for p in (ROOT / "harness").glob("*/__init__.py"))


def test_the_judge_is_grouped_by_concern():
    # the judge's modules live in its packages; at the top only its entry point and the two modules
    # kernel files and exported packages import by path (harness.cuda_launcher, harness.cuda_build)
    top = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "cuda_build.py", "cuda_launcher.py", "judge.py"]
    assert {"correctness", "isolation", "timing", "workers", "kernelbench", "device"} <= set(HARNESS_PACKAGES)


@pytest.mark.parametrize("package", HARNESS_PACKAGES)
def test_each_judge_package_says_what_it_does_never_does_and_where_to_start(package):
    path = ROOT / "harness" / package
    doc = ast.get_docstring(ast.parse((path / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert len(doc.splitlines()) >= 3, f"harness/{package}/__init__.py says too little"
    assert "open first" in doc, f"harness/{package}/__init__.py names no module to open first"
    assert "Never" in doc, f"harness/{package}/__init__.py says nothing of what it must never do"
    named = set(re.findall(r"\b([a-z_]+)\.py\b", doc))
    missing = [m for m in named if not list(ROOT.glob(f"harness/**/{m}.py"))]
    assert missing == [], f"harness/{package}/__init__.py names modules that do not exist: {missing}"


def test_a_planted_circle_inside_the_judge_is_found(tree):
    # the registry is the judge's bottom layer: importing the timing loop from it closes a circle
    # (the timing loop's measurement imports the registry) and points up
    _plant(tree / "harness" / "kernel_types" / "registry.py", "from harness.timing import measurement")
    found = import_graph.circles(import_graph.graph(tree))
    assert any({"harness.kernel_types.registry", "harness.timing.measurement"} <= set(c) for c in found)
    wrong = import_graph.upward(import_graph.graph(tree))
    assert any(w.startswith("harness.kernel_types.registry -> harness.timing.measurement") for w in wrong)


def test_the_paths_kernel_files_import_still_work():
    # CUDA C++ kernel files and exported packages import the launcher and the contract by these paths
    import harness.cuda_build
    import harness.cuda_launcher
    assert callable(harness.cuda_launcher.load_launcher) and callable(harness.cuda_build.nvcc_path)
