"""The Triton starter kernels: their declared literals, the real judge's verdict on each, and a
second CONFIG per starter checked on the judge's own cases against the float64 references.

The expensive part (nine judgements, forward and backward, and one interpreter process checking the
second CONFIGs) runs once per module, two processes at a time across the CPU cores.
Run as a script, this file is that interpreter process: `PYTHONPATH=.:tests/support python tests/harness/test_starters_triton.py
--check OUT.json KERNEL_TYPE=PATH ...` (with TRITON_INTERPRET=1 in its environment).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autokernel.search.kernel_source import apply_config
from harness.kernel_types import registry
from harness.judge import judge
from harness.workers.judge_session import judge_session
from starter_configs import TRITON as SECOND_CONFIGS
from starter_verdicts import assert_starter_passes, stage_report
from starter_kernels import KERNEL_TYPES, SINGLE_TYPES, starter_path
from paths import ROOT


PARALLEL_JOBS = 2  # the CI machine has two cores
CHECK_TIMEOUT_S = 900


def _source(kernel_type: str) -> str:
    return starter_path(kernel_type).read_text(encoding="utf-8")


# ------------------------------------------------------------------ the package
def test_starter_path_finds_one_file_per_registered_type():
    assert set(KERNEL_TYPES) == set(registry.names())
    for kernel_type in KERNEL_TYPES:
        path = starter_path(kernel_type)
        assert path.is_file() and path.name == f"{kernel_type}.py" and path.parent.name == "triton"


def test_starter_path_names_what_is_known_when_asked_for_something_else():
    with pytest.raises(KeyError, match="known types are .*softmax"):
        starter_path("conv9")
    with pytest.raises(KeyError, match="use one of triton, cuda"):
        starter_path("softmax", backend="opencl")


# ------------------------------------------------------------------ the literals
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_every_dot_asks_for_ieee_fp32(kernel_type):
    # a tl.dot without input_precision="ieee" runs fp32 operands as TF32 on a GPU: 10 mantissa bits
    for node in ast.walk(ast.parse(_source(kernel_type))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dot":
            precision = {k.arg: k.value for k in node.keywords}.get("input_precision")
            assert isinstance(precision, ast.Constant) and precision.value == "ieee", ast.unparse(node)


# ------------------------------------------------------------------ judged and checked
def _write_second_configs(tmp: Path) -> dict[str, Path]:
    """Second CONFIGs written the tuner's way (only the CONFIG line rewritten)."""
    paths = {}
    for kernel_type, config in SECOND_CONFIGS.items():
        paths[kernel_type] = tmp / f"{kernel_type}_second.py"
        paths[kernel_type].write_text(apply_config(_source(kernel_type), config), encoding="utf-8")
    return paths


def _check_second_configs(tmp: Path, paths: dict[str, Path]) -> dict:
    """The second configs checked in one interpreter process."""
    specs = [f"{kernel_type}={path}" for kernel_type, path in paths.items()]
    out = tmp / "second_configs.json"
    # the script is started by path: the project root must be importable as it is for pytest;
    # one BLAS thread, as numpy's many spin-waiting threads only slow the interpreter on 2 cores
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests" / "support"),
                                                      os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, __file__, "--check", str(out), *specs], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("starters")
    # each job is its own process: threads suffice; the starters are judged as `autokernel
    # optimize` judges a baseline, by workers forked from a pre-imported one
    seconds = _write_second_configs(tmp)
    with judge_session(fork=True), ThreadPoolExecutor(PARALLEL_JOBS) as pool:
        second = pool.submit(_check_second_configs, tmp, seconds)
        # with their backwards, as a training run judges them (the forward's verdict is the same)
        # (the chains' starters in a file of their own, so a second test process judges them meanwhile:
        # tests/harness/test_starters_chains.py)
        verdicts = {t: pool.submit(judge, starter_path(t), device="cpu", backward=True) for t in SINGLE_TYPES}
        # judged too: a second config is a kernel of its own
        softmax_second_verdict = pool.submit(judge, seconds["softmax"], device="cpu")
        return {"verdicts": {t: f.result() for t, f in verdicts.items()}, "second": second.result(),
                "softmax_second": softmax_second_verdict.result()}


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", SINGLE_TYPES)
def test_judge_passes_the_starter_forward_and_backward(results, kernel_type):
    assert_starter_passes(results["verdicts"][kernel_type], kernel_type)


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_second_config_is_correct_on_every_judged_case(results, kernel_type):
    found = results["second"][kernel_type]
    assert found["failures"] == [], "\n".join(found["failures"])
    assert found["cases"] >= 15  # the stages' cases in two dtypes, not an empty plan


@pytest.mark.slow
def test_beyond_the_contract_cases_match_pytorch(results):
    # ignore_index=-100 in cross_entropy, q and k of different lengths, head dims that are not
    # powers of two or below tl.dot's 16, a 3-D matmul operand
    extras = results["second"]["extras"]
    assert extras["failures"] == [] and extras["cases"] == 6, extras


# ------------------------------------------------------------------ the checking process
def _load(path: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_cases(module, cases) -> dict:
    from harness.correctness.compare import compare
    failures, start = [], time.perf_counter()
    for case in cases:
        args, kwargs = registry.build_inputs(case)
        try:
            result = compare(module.kernel_fn(*args, **kwargs), registry.reference_output(case), case, args)
            if not result.ok:
                failures.append(f"{case.label()}: {result.detail}")
        except Exception as e:  # a crash is a failure of that case, reported with the others
            failures.append(f"{case.label()}: {type(e).__name__}: {e}")
    return {"cases": len(cases), "failures": failures, "seconds": time.perf_counter() - start}


def _extras(paths: dict[str, str]) -> dict:
    import torch
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(7)
    failures, checked = [], []

    def expect(name, got, want, tol):
        checked.append(name)
        if not torch.allclose(got.double(), want, rtol=tol, atol=tol):
            failures.append(f"{name}: max error {(got.double() - want).abs().max().item():.3g}")

    ce = _load(paths["cross_entropy"])
    logits = torch.randn(6, 50, generator=gen)
    targets = torch.tensor([3, -100, 49, 0, -100, 7])
    expect("cross_entropy ignore_index", ce.kernel_fn(logits, targets), F.cross_entropy(logits.double(), targets), 1e-5)
    attn = _load(paths["flash_attention"])
    q, k, v = (torch.randn(1, 2, s, 32, generator=gen) for s in (24, 40, 40))
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        expect(f"attention seq_q != seq_k causal={causal}", attn.kernel_fn(q, k, v, causal), want, 1e-5)
    for head_dim in (2, 96):  # padded to a power of two of at least 16, then masked
        q, k, v = (torch.randn(1, 2, 20, head_dim, generator=gen) for _ in range(3))
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
        expect(f"attention D={head_dim}", attn.kernel_fn(q, k, v, True), want, 1e-5)
    mm = _load(paths["matmul"])
    a, b = torch.randn(2, 5, 24, generator=gen), torch.randn(24, 9, generator=gen)
    expect("matmul 3-D a", mm.kernel_fn(a, b), a.double() @ b.double(), 1e-5)
    return {"cases": len(checked), "failures": failures}


def _check_main(out: str, specs: list[str]) -> None:
    from harness.correctness import launches
    from harness.correctness.cases import CORRECTNESS_STAGES, Capabilities, build_plan
    launches.install()  # as in every judged process: tl.dot as a GPU computes it, bf16 included
    paths = dict(spec.split("=", 1) for spec in specs)
    found = {}
    for kernel_type, path in paths.items():
        plan = build_plan(kernel_type, Capabilities("cpu", bf16=False))
        found[kernel_type] = _run_cases(_load(path), [c for s in CORRECTNESS_STAGES for c in plan.stages[s]])
    found["extras"] = _extras(paths)
    Path(out).write_text(json.dumps(found, indent=1), encoding="utf-8")


if __name__ == "__main__" and sys.argv[1:2] == ["--check"]:
    _check_main(sys.argv[2], sys.argv[3:])


@pytest.mark.slow
def test_two_configs_of_one_starter_pass_the_judge_with_different_code(results):
    second, first = results["softmax_second"], results["verdicts"]["softmax"]
    assert second["verdict"] == "PASS", stage_report(second)

    def code(verdict):  # what was compiled for sm_90: one hash per kernel specialization
        return sorted(k["hash"] for k in verdict["resources"]["kernels"])
    assert code(first) and code(second) and code(first) != code(second)
