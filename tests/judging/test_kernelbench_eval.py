"""`autokernel kernelbench eval` against solutions that are correct, wrong, or cheat in the ways
KernelBench's own evaluation lets through. Every (problem, solution) pair is judged once, two at a
time, by a module fixture; the tests read the verdicts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from autokernel.judging.kb_evaluate import EvalOptions, RefCache, evaluate
from harness.workers import forkserver
from harness.workers.judge_session import judge_session
from paths import KERNELBENCH

HERE = KERNELBENCH
RELU = HERE / "level1" / "19_ReLU.py"
SOFTMAX = HERE / "level1" / "23_Softmax.py"
TINY = HERE / "level1" / "96_ScaleByTiny.py"
GEMM = HERE / "level2" / "12_Gemm_Multiply_LeakyReLU.py"
MLP = HERE / "level3" / "1_MLP.py"
SOL = HERE / "solutions"
# one warm-up: the Triton interpreter is slow and CPU timings mean nothing anyway; 1 + 10 timed
# calls also let the late cache (which switches on after 8 calls) show itself
OPTS = EvalOptions(device="cpu", reps=10, warmup=1, timeout_s=60, compile_baseline=False)
CASES = {
    "relu_correct": (RELU, "19_ReLU_correct.py", {}),
    "relu_wrong": (RELU, "19_ReLU_wrong.py", {}),
    "relu_pytorch": (RELU, "19_ReLU_pytorch.py", {}),
    "relu_replay": (RELU, "19_ReLU_replay.py", {}),
    "relu_late_cache": (RELU, "19_ReLU_late_cache.py", {}),
    "relu_eager_when_timed": (RELU, "19_ReLU_eager_when_timed.py", {}),
    "relu_zeros": (RELU, "19_ReLU_zeros.py", {}),
    "relu_inplace": (RELU, "19_ReLU_inplace.py", {}),
    "relu_hang": (RELU, "19_ReLU_hang.py", {"timeout_s": 5}),  # its check child forks: in forward at once
    "relu_segfault": (RELU, "19_ReLU_segfault.py", {}),
    "softmax_correct": (SOFTMAX, "23_Softmax_correct.py", {}),
    "tiny_zeros": (TINY, "96_ScaleByTiny_zeros.py", {}),
    "gemm_correct": (GEMM, "12_Gemm_Multiply_LeakyReLU_correct.py", {}),
    "mlp_partial": (MLP, "1_MLP_partial.py", {}),
}

# cheats that count calls or key a cache by id(x): state, refused by the static check before import
KEEP_STATE = ("relu_replay", "relu_late_cache", "relu_eager_when_timed")


@pytest.fixture(scope="module")
def kernelbench_verdicts(request) -> dict[str, dict]:
    from dataclasses import replace
    cache = RefCache()

    def judge(name: str) -> tuple[str, dict]:
        problem, solution, extra = CASES[name]
        return name, evaluate(problem, SOL / solution, replace(OPTS, **extra), cache)

    # the hang first: its deadline runs while the others are judged; under --reverse (CI's second
    # pass) the others in the opposite order, so each verdict follows other judgements
    others = [n for n in CASES if n != "relu_hang"]
    order = ["relu_hang"] + others[::-1 if request.config.getoption("reverse", False) else 1]
    # one judge session, as a kernelbench run holds: every child, the references' too, forks from
    # its pre-imported workers
    with judge_session():
        for problem in {p for p, _, _ in CASES.values()}:
            cache.reference(problem, replace(OPTS))  # one reference child per problem, shared
        with ThreadPoolExecutor(max_workers=2) as pool:
            found = dict(pool.map(judge, [n for n in order if n not in KEEP_STATE]))
    # the cheats that keep state are refused before import; the checks behind the filter are tested
    # with it switched off (a session of their own: its workers read the switch when they start)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOKERNEL_STATIC_CHECK", "off")
        with judge_session(), ThreadPoolExecutor(max_workers=2) as pool:
            found.update(pool.map(judge, [n for n in order if n in KEEP_STATE]))
    return found


@pytest.fixture
def verdicts(kernelbench_verdicts):
    """Every case's verdict; the batch is judged again in reverse order in CI's second pass
    (tests/conftest.py, REVERSED_BATCHES)."""
    return kernelbench_verdicts


def test_the_cheats_that_keep_state_are_refused_before_import():
    from harness.isolation.static_check import check_file
    for name in KEEP_STATE:
        refused = check_file(SOL / CASES[name][1], model=True)
        assert any(v.rule in ("state", "formatting") for v in refused), (name, refused)


@pytest.mark.parametrize("name", ["relu_correct", "softmax_correct", "gemm_correct", "mlp_partial"])
def test_correct_solutions_pass(verdicts, name):
    v = verdicts[name]
    assert (v["verdict"], v["correct"], v["failed_stage"]) == ("PASS", True, None), v["reason"]
    assert len(v["trials"]) == 5 and all(t["passed"] and t["counted"] for t in v["trials"])
    assert len({t["seed"] for t in v["trials"]}) == 5
    assert v["speedup_vs_eager"] > 0 and v["speedup_vs_compile"] is None
    timing = v["timing"]
    assert timing["reps"] == 10 and len(timing["samples_us"]) == 10
    assert timing["representative_of_gpu"] is False and "not representative" in timing["method"]
    assert timing["eager"]["representative_of_gpu"] is False
    assert v["device"]["type"] == "cpu" and v["versions"]["torch"]
    # each evaluation's children fork from one pre-imported worker, shared by the evaluations at once
    assert v["workers"] == ({"check": "fork", "time": "fork"} if forkserver.enabled() else
                            {"check": "spawn", "time": "spawn"})


def test_randomly_initialised_linear_compares_fairly(verdicts):
    # the solution creates another layer first, so only the copy of Model's state makes it agree
    state = verdicts["gemm_correct"]["integrity"]["state_copied"]
    assert set(state["copied"]) == {"gemm.weight", "gemm.bias"}
    assert set(state["unmatched"]) == {"unused.weight", "unused.bias"}


def test_partial_solution_flags_pytorch_main_op(verdicts):
    v = verdicts["mlp_partial"]
    assert "aten::addmm" in v["integrity"]["pytorch_ops"]
    assert any(f.startswith("main op in PyTorch") and "aten::addmm" in f for f in v["flags"])
    assert not verdicts["relu_correct"]["flags"]


def test_wrong_solution_fails_correctness_with_errors_per_trial(verdicts):
    v = verdicts["relu_wrong"]
    assert (v["verdict"], v["failed_stage"], v["correct"]) == ("FAIL", "correctness", False)
    assert len(v["trials"]) == 5 and not any(t["passed"] for t in v["trials"])
    # leaky slope 0.01 on N(0, 1) inputs: the worst error is 0.01 * |most negative input|
    assert all(0.01 < t["max_abs_err"] < 0.06 for t in v["trials"])
    assert v["timing"] is None and v["speedup_vs_eager"] is None


def test_pytorch_rewiring_fails_integrity(verdicts):
    v = verdicts["relu_pytorch"]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity")
    assert "no custom Triton or CUDA kernel" in v["reason"] and "aten::clamp_min" in v["reason"]


def test_result_cache_per_input_fails_replay_probe(verdicts):
    v = verdicts["relu_replay"]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity")
    assert "refilled in place" in v["reason"]


def test_cache_that_switches_on_when_timed_fails_timed_output_check(verdicts):
    v = verdicts["relu_late_cache"]
    assert all(t["passed"] for t in v["trials"])  # honest during the correctness trials
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "timing")
    assert "timed rep" in v["reason"] and "wrong result" in v["reason"]


def test_pytorch_compute_only_when_timed_fails_timing_naming_it(verdicts):
    v = verdicts["relu_eager_when_timed"]
    assert all(t["passed"] for t in v["trials"])  # its own Triton kernel during the correctness trials
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "timing")
    assert "PyTorch compute when timed that none of its checked calls ran: aten::relu" in v["reason"]


def test_zeros_with_patched_comparison_are_refused_before_import(verdicts):
    v = verdicts["relu_zeros"]
    # rebinding torch.allclose is refused by the static check, naming the line, before any import
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "load")
    assert "19_ReLU_zeros.py:9: assignment to a module attribute: torch.allclose" in v["reason"]
    assert any("reassigns a torch function" in f for f in v["flags"])


def test_trials_that_zeros_pass_are_not_counted(verdicts):
    v = verdicts["tiny_zeros"]
    assert all(t["passed"] and not t["counted"] for t in v["trials"])
    assert (v["verdict"], v["failed_stage"], v["correct"]) == ("FAIL", "correctness", False)
    assert "no trial counts" in v["reason"]


def test_input_mutation_fails_integrity(verdicts):
    v = verdicts["relu_inplace"]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity")
    assert "writes into its inputs" in v["reason"]


def test_hang_is_a_timeout(verdicts):
    v = verdicts["relu_hang"]
    assert (v["verdict"], v["failed_stage"], v["correct"]) == ("TIMEOUT", "correctness", False)


def test_segfault_is_a_crash_with_the_stderr_tail(verdicts):
    v = verdicts["relu_segfault"]
    assert (v["verdict"], v["failed_stage"], v["correct"]) == ("CRASH", "correctness", False)
    assert "SIGSEGV" in v["reason"]
    # the fault handler's stack names the solution's kernel (a deep interpreter stack can push its
    # "Segmentation fault" header out of the tail)
    assert "19_ReLU_segfault.py\", line 11 in wild_kernel" in v["stderr_tail"]
    assert v["sandbox"]["kind"] == "landlock"  # recorded before the solution ran, so a crash keeps it


def test_cli_json_is_one_object_and_exit_status_follows_the_verdict(tmp_path):
    argv = [sys.executable, "-m", "autokernel", "kernelbench", "eval", "--problem", str(RELU),
            "--device", "cpu", "--json", "--reps", "3", "--timeout", "60"]
    # three reps, not two: the witness asks that more than half the reps agree with the judge's
    # clock, and with two a single rep preempted on a busy machine between its clock and its send
    # would fail an honest solution
    # the torch.compile baseline gets 1 s, in which a fresh child cannot even import torch and
    # compile: it must come back null with the reason, and the verdict must not suffer. Fresh: with
    # AUTOKERNEL_JUDGE_FORK=0 every child is spawned, none forked from a pre-imported worker
    good = subprocess.run(argv + ["--solution", str(SOL / "19_ReLU_correct.py"), "--compile-timeout", "1"],
                          capture_output=True, text=True, env={**os.environ, "AUTOKERNEL_JUDGE_FORK": "0"})
    assert good.returncode == 0, good.stderr
    verdict = json.loads(good.stdout)  # exactly one object: anything else on stdout breaks this
    assert verdict["verdict"] == "PASS" and verdict["correct"] is True and verdict["flags"] == []
    assert verdict["timing"]["reps"] == 3
    assert verdict["speedup_vs_compile"] is None and verdict["timing"]["compile"] is None
    assert any("torch.compile baseline unavailable" in n and "longer than 1 s" in n for n in verdict["notes"])
    assert verdict["workers"] == {"check": "spawn", "time": "spawn"}
    missing = tmp_path / "no_model_new.py"
    missing.write_text("import torch\n")
    usage = subprocess.run(argv + ["--solution", str(missing)], capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stdout == "" and "defines no ModelNew" in usage.stderr


def test_replacing_the_kernelbench_protocol_is_seen_by_the_identity_guard(monkeypatch):
    # the child's seeding, inputs and timing live in harness.kernelbench.kb_protocol: a solution that swaps
    # one of them (a friendlier time_model, a refill that does nothing) must be named
    from harness.kernelbench import kb_protocol
    from harness.isolation.tamper import IdentityGuard
    guard = IdentityGuard(("__main__",))
    monkeypatch.setattr(kb_protocol, "time_model", lambda *a, **k: {})
    monkeypatch.setattr(kb_protocol.Refill, "__call__", lambda self, i: None)
    assert {"harness.kernelbench.kb_protocol.time_model", "harness.kernelbench.kb_protocol.Refill.__call__"} <= set(guard.replaced())
