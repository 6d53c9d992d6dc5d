"""The other places a kernel first launches, rehearsed behind the stand-in driver
(tests/rehearsal/conftest.py): its winners served by verify's child, `export --selftest`'s child and
the exported package in a user's process, and a KernelBench solution in the KernelBench child. The
winners are Triton starters, of a finished run on the tiny LLaMA (and for patch(), on a model
whose served calls each read its input)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import standin_gpu
from rehearsal import REFUSED, assert_launched, rehearse, scratch
from paths import DATA, KERNELBENCH
from tiny_llama import proven_around
from starter_kernels import starter_path


@pytest.fixture(scope="module")
def starters_run(tmp_path_factory) -> Path:
    from tiny_llama import make_run
    return make_run(tmp_path_factory.mktemp("rehearsed-run"))


@pytest.fixture(scope="module")
def package(starters_run, tmp_path_factory) -> Path:
    from autokernel.deploy.export import export
    parent = tmp_path_factory.mktemp("rehearsed-package")
    export(starters_run, parent)
    return parent


# winners of the model in tests/data/branches.py, each reading the model's input
BRANCHES = [("rmsnorm[8x32:float32]", "rmsnorm", {"M": 8, "N": 32}, {}, "module", [{"name": "norm", "class": "RMSNorm"}]),
            ("fused_mlp[8x32x64:float32]", "fused_mlp", {"M": 8, "D": 32, "F": 64}, {}, "module",
             [{"name": "mlp", "class": "MLP"}]),
            ("matmul[8x32x32:float32]", "matmul", {"M": 8, "K": 32, "N": 32}, {}, "op", [{"name": "proj", "class": "Linear"}])]


@pytest.fixture(scope="module")
def patching_package(tmp_path_factory) -> Path:
    """An exported package of Triton starters for a model none of whose served calls reads another's
    output: the stand-in computes nothing, and a served call's uninitialised output fed to the next
    (a module route's bind-time check, say) would make the next fall back by chance."""
    from autokernel.deploy.export import export
    from autokernel.profile.modelfile import ModelSpec
    from sealed_runs import write_run
    spec = ModelSpec(path=str(DATA / "branches.py"), class_name="Branches", input_shape=[1, 8, 32],
                     input_dtype="float32", init_args=[], device="cpu")
    sources = [(*t, starter_path(t[1]).read_text()) for t in BRANCHES]
    run = write_run(tmp_path_factory.mktemp("rehearsed-run-patch"), spec, sources, "run-branches", "float32",
                    verdict=proven_around)
    parent = tmp_path_factory.mktemp("rehearsed-package-patch")
    export(run.path, parent)
    return parent


def assert_every_winner_launched(result: dict, launched: list[str], stderr: str, winners: int) -> None:
    assert len(result["calls"]) == winners, result["calls"]
    for call in result["calls"]:
        assert call["error"] is None, (call["name"], call["error"][-3000:])
    assert len(launched) >= winners, f"{len(launched)} launches for {winners} winners:\n{stderr[-3000:]}"
    assert not any(word in stderr for word in REFUSED), stderr[-3000:]


def test_every_winner_first_launches_in_verifys_child(driver, starters_run, tmp_path):
    root, base = scratch(tmp_path)
    copy = root / "run" / starters_run.name  # where verify works: a copy of the run in its scratch
    shutil.copytree(starters_run, copy)
    result, launched, stderr = rehearse("verify", [copy, root], standin_gpu.environment(base, driver), root)
    assert result["sandbox"] == "landlock", result
    assert_every_winner_launched(result, launched, stderr, winners=5)


def test_every_kernel_first_launches_in_the_export_selftests_child(driver, package, tmp_path):
    root, base = scratch(tmp_path)
    result, launched, stderr = rehearse("export_check", [package, root], standin_gpu.environment(base, driver), root)
    assert result["sandbox"] == "landlock", result
    assert_every_winner_launched(result, launched, stderr, winners=5)


def test_the_exported_packages_patch_serves_first_launches_in_a_users_process(driver, patching_package, tmp_path):
    """A plain user process: no judge, the package's own audit hook on (AUTOKERNEL_KERNEL_AUDIT's
    default), the unmodified model patched; every winner serves its calls through the real backend."""
    _, base = scratch(tmp_path)
    env = standin_gpu.environment({**base, "AUTOKERNEL_KERNEL_AUDIT": "on"}, driver)
    result, launched, stderr = rehearse("package", [patching_package, DATA / "branches.py"], env, tmp_path)
    assert result["guard"] == ["on"], result
    assert_every_winner_launched(result, launched, stderr, winners=len(BRANCHES))
    assert all(call["served"] > 0 for call in result["calls"]), result["calls"]


@pytest.mark.parametrize("problem, solution", [("19_ReLU", "19_ReLU_correct"), ("23_Softmax", "the wrapped starter")])
def test_a_kernelbench_solution_first_launches_in_the_kernelbench_child(driver, tmp_path, problem, solution):
    from autokernel.kernelbench.adapters import match_problem, wrap_starter
    root, base = scratch(tmp_path)
    problem_file = KERNELBENCH / "level1" / f"{problem}.py"
    source = problem_file.read_text()
    if solution == "the wrapped starter":  # what a KernelBench run judges first for a matching problem
        text = wrap_starter(source, match_problem(source), starter_path("softmax").read_text())
    else:
        text = (KERNELBENCH / "solutions" / f"{solution}.py").read_text()
    copy = root / "src" / "solution.py"
    copy.write_text(text)
    result, launched, stderr = rehearse("kernelbench", [problem_file, copy, root],
                                        standin_gpu.environment(base, driver), root / "cwd")
    assert_launched(result, launched, stderr)
