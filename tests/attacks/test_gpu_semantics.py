"""Kernels judged as a GPU runs them, not as the interpreter does (tests/attacks/gpu_semantics_kernels.py):
each lie ends in FAIL for its named reason, the honest kernels beside it PASS, every Triton starter
of the attacked types in fp32 and bf16 among them (the CUDA C++ starters compile for the target:
tests/harness/test_starters_cuda.py), and a correct kernel whose CPU speed comes from a grid the
target GPU would leave idle PASSes but is not kept for speed."""
from __future__ import annotations

import sys

import pytest

import gpu_semantics_kernels
from autokernel.search.decision import decide
from autokernel.search.run import TargetState
from harness.kernel_types.registry import Case
from judge_batch import judge_batch
from paths import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
STARTERS = ROOT / "starter_kernels" / "triton"
# small timed cases: the interpreter is slow, and every class shows in the stages' own cases
TARGETS = {"cross_entropy": {"N": 16, "V": 256}, "matmul": {"M": 64, "K": 80, "N": 48}, "softmax": {"M": 16, "N": 256}}
ATTACKS = {"cross_entropy": ("chained_mean", "float_atomic_mean", "ticket_mean"),
           "matmul": ("tf32_matmul", "bf16_drops_tail", "ieee_matmul"),
           "softmax": ("one_program_softmax", "idle_grid_softmax", "lane_swap_softmax", "misaligned_softmax",
                       "one_slot_softmax", "zero_groups_softmax", "reordered_softmax", "lanes_add_softmax",
                       "autotune_accumulates_softmax", "autotune_caught_softmax", "host_cdiv_softmax")}
HONEST = {"ticket_mean", "ieee_matmul", "one_program_softmax", "idle_grid_softmax"}

# name -> (the stage that fails it, phrases its reason must hold)
EXPECTED = {
    "chained_mean": ("smoke", ("program order: the launch of _chained_kernel wrote different bytes",
                               "total_ptr is written by one of its programs and read or written by another")),
    "float_atomic_mean": (None, ("program order: the launch of _atomic_kernel", "atomic operation(s)")),
    "tf32_matmul": ("smoke", ("matmul[32x48x40:float32]", "out of tolerance",
                              "its tl.dot multiplied fp32 operands as TF32")),
    "bf16_drops_tail": ("shape_sweep", ("matmul[127x65x33:bfloat16]", "out of tolerance")),
    "lane_swap_softmax": ("smoke", ("lane order: in the launch of _lane_swap_kernel", "of scratch_ptr",
                                    "no tl.debug_barrier() between")),
    "misaligned_softmax": ("smoke", ("misaligned address: in the launch of _misaligned_kernel",
                                     "stores a 4-byte element at byte", "of scratch_ptr, which is not a multiple of 4")),
    "one_slot_softmax": ("smoke", ("lane order: in the launch of _one_slot_kernel, one store of one of its programs "
                                   "writes different values to byte", "of scratch_ptr from 128 of its lanes")),
    "zero_groups_softmax": ("smoke", ("out of tolerance", "an integer division or remainder by zero (")),
    "reordered_softmax": ("smoke", ("out of tolerance", "tl.reshape(..., can_reorder=True) or tl.cat")),
    "autotune_accumulates_softmax": ("compile", ("AutotuneNotJudged: @triton.autotune over 2 configs (_softmax_add)",
                                                 "Give the kernel one config (CONFIG's values")),
    "autotune_caught_softmax": ("compile", ("the first call failed", "AutotuneNotJudged (caught by the candidate; "
                                            "it stands): @triton.autotune over 2 configs (_softmax_add)")),
    "host_cdiv_softmax": ("shape_sweep", ("softmax[16x256:float32]", "Cannot call @triton.jit'd outside of the scope "
                                          "of a kernel", "triton.cdiv for tl.cdiv")),
    "lanes_add_softmax": ("determinism", ("repeated calls on identical inputs are not bitwise identical",
                                          "an atomic whose lanes aim at one address, run in no promised order")),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[tuple[str, str], dict]:
    """(name, dtype) -> verdict: each attack at its type's fp32 target, the starters at fp32 and bf16."""
    folder = tmp_path_factory.mktemp("gpu_semantics")
    sources = gpu_semantics_kernels.sources()
    verdicts = {}
    for kernel_type, dims in TARGETS.items():
        paths = {}
        for name in ATTACKS[kernel_type]:
            paths[name] = folder / f"{name}.py"
            paths[name].write_text(sources[name])
        paths["starter"] = STARTERS / f"{kernel_type}.py"
        fp32 = judge_batch(paths, Case.make(kernel_type, dims, "float32"))
        verdicts.update({(name, "float32"): v for name, v in fp32.items()})
        bf16 = judge_batch({"starter": paths["starter"]}, Case.make(kernel_type, dims, "bfloat16"))
        verdicts[(f"starter:{kernel_type}", "bfloat16")] = bf16["starter"]
        verdicts[(f"starter:{kernel_type}", "float32")] = verdicts.pop(("starter", "float32"))
    return verdicts


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_lie_fails_for_its_named_reason(judged, name):
    v = judged[(name, "float32")]
    stage, phrases = EXPECTED[name]
    assert v["verdict"] == "FAIL", _reason(v)[:2000]
    assert stage is None or v["failed_stage"] == stage, (v["failed_stage"], _reason(v)[:2000])
    for phrase in phrases:
        assert phrase in _reason(v), _reason(v)[:2000]


@pytest.mark.parametrize("name", sorted(HONEST) + [f"starter:{t}" for t in TARGETS])
def test_the_honest_kernels_pass_beside_them(judged, name):
    for dtype in ("float32", "bfloat16") if name.startswith("starter:") else ("float32",):
        v = judged[(name, dtype)]
        assert v["verdict"] == "PASS", (dtype, _reason(v)[:2000])
        assert v.get("stand_in_for") is None and v.get("judged_dtype") == dtype  # its own dtype was run


def test_every_bf16_case_was_run_not_skipped(judged):
    v = judged[("starter:matmul", "bfloat16")]
    sweep = next(s for s in v["stages"] if s["name"] == "shape_sweep")
    assert "skip" not in sweep["detail"] and "skipped" not in sweep
    assert v["timing"]["shape"] == "matmul[64x80x48:bfloat16]"


def test_a_grid_that_would_leave_the_gpu_idle_passes_and_is_not_kept_for_speed(judged):
    one = judged[("one_program_softmax", "float32")]
    rows = judged[("starter:softmax", "float32")]
    assert one["timing"]["representative_of_gpu"] is False  # the verdict still says whose times these are
    grid = one["timing"]["grid"]
    assert (grid["programs"], grid["needed"], grid["fills_target"]) == (1, 16, False)
    assert "does not keep it for speed" in grid["detail"]
    assert rows["timing"]["grid"]["fills_target"] is True
    # faster than the best by far, and still not kept; the starter's grid is kept. Both timings steady
    # (their reps' spread is the machine's, and a wide one is refused for its own reason): only the
    # grid differs
    target = TargetState(name="softmax[16x256:float32]", kernel_type="softmax", dims=TARGETS["softmax"],
                         dtype="float32", best_median_us=one["timing"]["median_us"] * 100, best_iqr_us=0.0, best_reps=50)
    steady = {"spread_ok": True, "iqr_us": 0.0}
    assert decide({**one, "timing": {**one["timing"], **steady}}, target) == "REVERT"
    assert decide({**rows, "timing": {**rows["timing"], **steady, "median_us": one["timing"]["median_us"]}},
                  target) == "KEEP"


def test_a_grid_whose_programs_return_without_work_is_not_kept_for_speed(judged):
    """One program per row launched, one of them doing every row: the programs are there, the work
    is not; the rule counts the programs that stored anything."""
    idle = judged[("idle_grid_softmax", "float32")]
    grid = idle["timing"]["grid"]
    assert (grid["programs"], grid["working"], grid["needed"], grid["fills_target"]) == (16, 1, 16, False)
    assert "1 of which stored anything" in grid["detail"]
    target = TargetState(name="softmax[16x256:float32]", kernel_type="softmax", dims=TARGETS["softmax"],
                         dtype="float32", best_median_us=idle["timing"]["median_us"] * 100, best_iqr_us=0.0,
                         best_reps=50)
    assert decide({**idle, "timing": {**idle["timing"], "spread_ok": True, "iqr_us": 0.0}}, target) == "REVERT"
    rows = judged[("starter:softmax", "float32")]["timing"]["grid"]
    assert rows["working"] == rows["programs"] and rows["fills_target"] is True


CHAINED_RELU = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, done_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    ready = tl.load(done_ptr + pid - 1, mask=pid > 0, other=1.0)  # 1.0 once program pid - 1 has run
    tl.store(y_ptr + offs, tl.maximum(x, 0.0) * ready, mask=mask)
    tl.store(done_ptr + pid, 1.0)


def relu(x):
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    done = torch.zeros(triton.cdiv(n, 1024), device=x.device)
    relu_kernel[(triton.cdiv(n, 1024),)](x, y, done, n, BLOCK=1024)
    return y


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return relu(x)
'''


def test_a_kernelbench_model_new_whose_programs_wait_on_each_other_fails_for_it(tmp_path):
    """KernelBench eval runs the same orders: a ReLU whose programs read a flag the previous program
    wrote is right in id order only; the honest one passes beside it."""
    from autokernel.judging.kb_evaluate import EvalOptions, RefCache, evaluate
    from harness.workers.judge_session import judge_session
    from paths import KERNELBENCH
    relu = KERNELBENCH / "level1" / "19_ReLU.py"
    chained = tmp_path / "19_ReLU_chained.py"
    chained.write_text(CHAINED_RELU)
    opts = EvalOptions(device="cpu", reps=4, warmup=1, timeout_s=300, compile_baseline=False)
    cache = RefCache()
    with judge_session():
        lying = evaluate(relu, chained, opts, cache)
        honest = evaluate(relu, KERNELBENCH / "solutions" / "19_ReLU_correct.py", opts, cache)
    assert (lying["verdict"], lying["failed_stage"]) == ("FAIL", "correctness"), lying.get("reason", "")[:2000]
    assert "program order: the launch of relu_kernel" in lying["reason"]
    assert honest["verdict"] == "PASS", honest.get("reason", "")[:2000]
