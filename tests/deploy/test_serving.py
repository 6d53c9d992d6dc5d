"""Serving ranges: which calls a winner serves (the free dims its judge proved; on a GPU only where it
was measured not slower), why every other call falls back, how a run's records give the range, and
torch.compile(dynamic=True) keeping the kernels across sequence lengths with one graph.

The routing tests use kernels written in PyTorch (the router does not care what a kernel_fn runs);
the GPU decisions use figures recorded on an H200 (tests/data/h200_leaderboard.tsv), so they run on a CPU."""
import csv

import pytest
import torch

from autokernel.deploy import routing
from autokernel.deploy.routing.serving import FREE_DIMS, ServingRange, Shape, only_for_speed, words
from autokernel.deploy.winners import OLD_RECORD, serving_range
from harness.verdict import around
from tiny_llama import TARGETS, llama, pytorch_kernel
from paths import DATA

# the leaderboard an H200 run of the LLaMA example wrote (bf16, the tuner, 2026-12-01), as recorded
EVIDENCE = DATA / "h200_leaderboard.tsv"


def rows(points, dims=None, **figures):
    """An rmsnorm range at N=384 proven at `points` rows."""
    dims = dims or {"M": 128, "N": 384}
    return ServingRange("rmsnorm", "float32", dims, None, [Shape({**dims, "M": m}, True, **figures) for m in points])


def why(serving, dims, on_gpu=False):
    refusal = serving.refusal(dims, on_gpu)
    return None if refusal is None else words(refusal)


# ---------------------------------------------------------------- the decision
def test_on_the_cpu_every_row_count_between_the_proven_ones_is_served_and_none_beyond():
    serving = rows([128, 67, 256, 1])
    for m in (1, 2, 67, 100, 128, 256):
        assert why(serving, {"M": m, "N": 384}) is None, m
    assert why(serving, {"M": 257, "N": 384}) == "rows 257: not proven (judged at rows 1 to 256)"
    assert not serving.same_family({"M": 128, "N": 512}, "float32", None)  # another width: never this winner's
    assert not serving.same_family({"M": 128, "N": 384}, "float16", None)


def test_a_record_from_before_serving_ranges_serves_its_target_alone():
    serving = ServingRange.exact("rmsnorm", {"M": 128, "N": 384}, "float32")
    assert why(serving, {"M": 128, "N": 384}) is None
    assert why(serving, {"M": 67, "N": 384}) == "rows 67: not proven (judged at rows 128)"
    assert why(serving, {"M": 1, "N": 384}) == "1 row: not proven (judged at rows 128)"


def test_a_kernel_wrong_at_one_shape_is_served_only_at_the_shapes_it_was_right():
    serving = rows([128, 67, 256])
    serving.shapes.append(Shape({"M": 1, "N": 384}, False, detail="wrong result"))
    assert why(serving, {"M": 1, "N": 384}) == "1 row: the kernel gave a wrong answer there when judged"
    assert why(serving, {"M": 67, "N": 384}) is None and why(serving, {"M": 256, "N": 384}) is None
    assert why(serving, {"M": 100, "N": 384}) == "rows 100: not proven (judged at rows 67 or 128 or 256)"


def test_attention_varies_batch_and_sequence_and_keeps_heads_and_head_size():
    dims = {"B": 1, "H": 6, "S": 128, "D": 64}
    shapes = [Shape({**dims, "S": s}, True) for s in (128, 67, 256, 1)] + [Shape({**dims, "B": 2}, True)]
    serving = ServingRange("flash_attention", "float16", dims, True, shapes)
    assert why(serving, {"B": 2, "H": 6, "S": 100, "D": 64}) is None
    assert why(serving, {"B": 3, "H": 6, "S": 128, "D": 64}) == "batch 3: not proven (judged at batch 1 to 2, sequence 1 to 256)"
    assert not serving.same_family({"B": 1, "H": 8, "S": 128, "D": 64}, "float16", True)
    assert not serving.same_family(dims, "float16", False)  # not causal: another kernel's calls


def test_on_a_gpu_a_call_is_served_only_between_shapes_measured_not_slower():
    serving = rows([128, 67, 256, 1])
    serving.representative = True
    for shape, fast in zip(serving.shapes, (True, True, False, False)):
        shape.not_slower = fast
    assert why(serving, {"M": 100, "N": 384}, on_gpu=True) is None  # between 67 and 128, both faster
    assert why(serving, {"M": 1, "N": 384}, on_gpu=True) == "1 row: slower here"
    assert why(serving, {"M": 30, "N": 384}, on_gpu=True) == "rows 30: not measured"  # between 1 (slower) and 67
    assert why(serving, {"M": 200, "N": 384}, on_gpu=True) == "rows 200: not measured"
    assert why(serving, {"M": 1, "N": 384}, on_gpu=False) is None  # the same figures say nothing to a CPU
    assert only_for_speed({"1 row: slower here": 2, "rows 30: not measured": 1})
    assert not only_for_speed({"1 row: slower here": 2, "rows 300: not proven (judged at rows 1 to 256)": 1})


def test_a_fused_loss_slower_than_pytorch_still_serves_on_a_gpu_its_gain_is_memory():
    """The fused projection + cross-entropy never holds the logits: in a training step that is its
    gain, so a GPU's figures that call it slower keep no call from it (verify reports its speed)."""
    dims = {"N": 2048, "D": 64, "V": 32000}
    slower = [Shape({**dims, "N": n}, True, not_slower=False) for n in (1, 1025, 4096)]
    loss = ServingRange("linear_cross_entropy", "float32", dims, None, slower, representative=True)
    assert loss.refusal(dims, on_gpu=True) is None and loss.refusal({**dims, "N": 300}, on_gpu=True) is None
    assert why(loss, {**dims, "N": 5000}, on_gpu=True) == "rows 5000: not proven (judged at rows 1 to 4096)"
    norm = ServingRange("rmsnorm", "float32", {"M": 128, "N": 384}, None,
                        [Shape({"M": m, "N": 384}, True, not_slower=False) for m in (1, 128, 256)], representative=True)
    assert why(norm, {"M": 128, "N": 384}, on_gpu=True) == "rows 128: slower here"  # time is a norm's gain


def h200_rows():
    with EVIDENCE.open() as f:
        return {r["kernel_type"]: r for r in csv.DictReader(f, delimiter="\t")}


def test_recorded_h200_figures_serve_the_faster_kernel_and_keep_pytorch_where_the_kernel_is_slower():
    """The H200 run's verdicts at their targets (no shapes around them were timed then): rmsnorm
    1.37x faster than PyTorch is served at its target on a GPU; the fused MLP at 0.28x is not."""
    decided = {}
    for kernel_type, dims in (("rmsnorm", {"M": 2048, "N": 2048}), ("fused_mlp", {"M": 2048, "D": 2048, "F": 5632})):
        row = h200_rows()[kernel_type]
        timing = {"median_us": float(row["median_us"]), "baseline_median_us": float(row["baseline_us"]),
                  "iqr_us": 0.0, "reps": 100, "representative_of_gpu": True}
        target = type("T", (), {"kernel_type": kernel_type, "dims": dims, "dtype": "bfloat16", "kwargs": {}})
        verdict = {"timing": timing, "timing_around": {"shapes": [], "skipped": None}}
        serving = ServingRange.from_json(serving_range(target, verdict))
        assert serving.representative
        decided[kernel_type] = why(serving, dims, on_gpu=True)
    assert decided == {"rmsnorm": None, "fused_mlp": "rows 2048: slower here"}


def test_the_free_dims_are_the_judges():
    # the exported package carries its own copy (it has no harness): they must not drift
    assert FREE_DIMS == around.FREE_DIMS


# ---------------------------------------------------------------- from a run's records
class Target:
    kernel_type, dims, dtype, kwargs = "rmsnorm", {"M": 128, "N": 384}, "float32", {}


def test_a_verdict_without_shapes_around_gives_the_exact_range_and_says_why():
    serving = serving_range(Target, {"verdict": "PASS", "timing": {"median_us": 5.0}})
    assert serving["note"] == OLD_RECORD and [s["dims"] for s in serving["shapes"]] == [Target.dims]


def test_a_verdict_with_shapes_around_gives_their_span_and_the_gpu_figures_decide_speed():
    def shape(m, ok=True, failed=False, median=8.0):
        return {"dims": {"M": m, "N": 384}, "ok": ok, "failed": failed, "median_us": median, "iqr_us": 0.1,
                "reps": 50, "baseline_median_us": 10.0, "baseline_iqr_us": 0.1, "baseline_reps": 50, "detail": ""}
    timing = {"median_us": 8.0, "iqr_us": 0.1, "reps": 50, "baseline_median_us": 10.0, "baseline_iqr_us": 0.1,
              "representative_of_gpu": True}
    verdict = {"timing": timing, "timing_around": {"skipped": None, "shapes": [
        shape(67), shape(256, median=20.0), shape(1, ok=False), shape(3, ok=False, failed=True)]}}
    serving = ServingRange.from_json(serving_range(Target, verdict))
    assert [(s.dims["M"], s.ok, s.not_slower) for s in serving.shapes] == [
        (128, True, True), (67, True, True), (256, True, False), (3, False, None)]  # 1: never checked
    assert why(serving, {"M": 67, "N": 384}, on_gpu=True) is None
    assert why(serving, {"M": 256, "N": 384}, on_gpu=True) == "rows 256: slower here"
    assert why(serving, {"M": 3, "N": 384}) == "rows 3: the kernel gave a wrong answer there when judged"
    # wrong at 3 rows: between the shapes it was right at, nothing is trusted
    assert why(serving, {"M": 100, "N": 384}) == "rows 100: not proven (judged at rows 67 or 128 or 256)"


@pytest.mark.gpu
def test_on_a_gpu_the_shapes_around_carry_representative_times_that_decide_where_the_kernel_serves():
    from harness.judge import judge
    from harness.kernel_types.registry import Case
    from starter_kernels import starter_path
    target = Case.make("rmsnorm", {"M": 4096, "N": 4096}, "float16")
    verdict = judge(starter_path("rmsnorm"), target=target, device="cuda", time_around=True)
    assert verdict["verdict"] == "PASS"
    shapes = verdict["timing_around"]["shapes"]
    assert [s["dims"]["M"] for s in shapes] == [2051, 8192, 1]
    assert all(s["ok"] and s["representative_of_gpu"] and s["median_us"] > 0 for s in shapes)
    t = type("T", (), {"kernel_type": "rmsnorm", "dims": target.dims, "dtype": "float16", "kwargs": {}})
    serving = ServingRange.from_json(serving_range(t, verdict))
    assert serving.representative and all(s.not_slower is not None for s in serving.shapes)
    for s in serving.shapes:  # a measured shape is served exactly when it was not slower there
        assert (serving.refusal(s.dims, on_gpu=True) is None) == s.not_slower


# ---------------------------------------------------------------- inside a model
def ranged_winners(calls, low=1, high=32):
    """The tiny LLaMA's winners, each proven from `low` to `high` on its main free dim."""
    found = []
    for t, kt, dims, kw, route, mods, _ in TARGETS:
        free = FREE_DIMS[kt][-1]
        shapes = [Shape({**dims, free: v}, True) for v in (low, dims[free], high)]
        serving = ServingRange(kt, "float32", dims, kw.get("causal"), shapes)
        found.append(routing.Winner(t, kt, dims, "float32", pytorch_kernel(kt, calls), kw, route, mods,
                                    serving=serving))
    return found


def test_a_winner_serves_other_lengths_in_its_range_and_counts_the_rest_with_the_reason():
    module, model, _ = llama()
    calls = []
    router = routing.Router(ranged_winners(calls, high=16))
    with torch.no_grad():
        for length in (5, 16, 40):
            tokens = torch.randint(0, 64, (1, length))
            expected = model(tokens)
            with router.patched(model):
                assert (model(tokens) - expected).abs().max().item() < 1e-5
    kernels = router.tally.to_json()["per_kernel"]
    for target, *_, per_forward in TARGETS:
        assert kernels[target]["calls_served"] == 2 * per_forward, target  # at 5 and 16 tokens
        assert kernels[target]["fallbacks"] == per_forward, target  # at 40, each counted
    assert kernels["rmsnorm[8x32:float32]"]["fallback_reasons"] == {"rows 40: not proven (judged at rows 1 to 16)": 3}
    assert kernels["flash_attention[1x2x8x16:float32,causal]"]["fallback_reasons"] == {
        "sequence 40: not proven (judged at batch 1, sequence 1 to 16)": 1}


def test_torch_compile_dynamic_keeps_the_kernels_across_lengths_with_one_graph_and_no_break():
    from torch._dynamo.utils import counters
    module, model, tokens = llama()
    calls, graphs = [], []

    def backend(gm, example_inputs):  # counts the graphs Dynamo hands over: one per (re)compile
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    counters.clear()
    router = routing.Router(ranged_winners(calls))
    per_forward = sum(n for *_, n in TARGETS)
    inputs = [torch.randint(0, 64, (1, length)) for length in (8, 13)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        with router.patched(model):
            model(tokens)  # the first eager forward binds the hand-written forms
            compiled = torch.compile(model, dynamic=True, backend=backend)
            for x, want in zip(inputs, expected):
                before = len(calls)
                assert (compiled(x) - want).abs().max().item() < 1e-5
                assert len(calls) - before == per_forward, x.shape  # every kernel ran, as a custom op
    assert len(graphs) == 1 and not counters["graph_break"]
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(op.startswith("autokernel.") for op in ops) == per_forward


def test_the_compiling_flag_is_marked_as_torch_compiler_marks_a_constant_result():
    # sites.compiling carries the mark by hand, so that patching imports no torch._dynamo: it must be
    # exactly what torch.compiler.assume_constant_result gives (the test above sees it at work)
    from autokernel.deploy.routing import sites

    def probe() -> bool:
        return False
    marks = dict(vars(torch.compiler.assume_constant_result(probe)))
    assert marks and {name: getattr(sites.compiling, name, None) for name in marks} == marks


def test_a_patched_model_run_eagerly_imports_no_dynamo():
    # a second of CPU in every process that serves winners (verify's child, an exported package)
    import subprocess
    import sys

    from paths import ROOT
    code = ("import sys, torch\n"
            "from tiny_llama import llama, TARGETS, pytorch_kernel\n"
            "from autokernel.deploy import routing\n"
            "module, model, tokens = llama()\n"
            "calls = []\n"
            "winners = [routing.Winner(t, kt, dims, 'float32', pytorch_kernel(kt, calls), kw, route, mods)\n"
            "           for t, kt, dims, kw, route, mods, _ in TARGETS]\n"
            "with torch.no_grad(), routing.Router(winners).patched(model):\n"
            "    model(tokens)\n"
            "print(len(calls), 'torch._dynamo' in sys.modules)\n")
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'support'}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    served, dynamo = out.stdout.split()
    assert int(served) == sum(n for *_, n in TARGETS) and dynamo == "False"
