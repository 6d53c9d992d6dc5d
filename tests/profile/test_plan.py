"""The Amdahl plan: pure arithmetic checked against figures worked out by hand."""
import math

import pytest

from autokernel.profile import plan
from autokernel.profile.profiler import Profile
from paths import DATA

PEAKS = {"device": "test device", "copy_gbps": 100.0, "matmul_tflops": {"float32": 1.0}}  # ridge: 10 FLOP/B


def test_amdahl_by_hand():
    assert plan.amdahl(0.5, 2.0) == pytest.approx(1 / (0.5 + 0.25))  # 1.3333
    assert plan.amdahl(0.4, 4.0) == pytest.approx(1 / 0.7)  # 0.6 + 0.4/4 = 0.7
    assert plan.amdahl(0.9, 10.0) == pytest.approx(1 / 0.19)  # 0.1 + 0.09
    assert plan.amdahl(0.3, 1.0) == pytest.approx(1.0)  # no faster: no gain
    assert plan.amdahl(0.0, 100.0) == pytest.approx(1.0)
    assert plan.amdahl(1.0, 3.0) == pytest.approx(3.0)  # the whole program


def test_amdahl_many_by_hand():
    # 1 / (1 - (0.5 * (1 - 1/2) + 0.3 * (1 - 1/3))) = 1 / (1 - 0.45) = 1 / 0.55
    assert plan.amdahl_many([(0.5, 2.0), (0.3, 3.0)]) == pytest.approx(1 / 0.55)
    assert plan.amdahl_many([(0.4, 4.0)]) == pytest.approx(plan.amdahl(0.4, 4.0))
    assert plan.amdahl_many([]) == pytest.approx(1.0)
    # two halves each made twice as fast: the whole is twice as fast
    assert plan.amdahl_many([(0.5, 2.0), (0.5, 2.0)]) == pytest.approx(2.0)


def test_ridge_bound_roofline_ceiling_by_hand():
    assert plan.ridge(10.0, 2000.0) == pytest.approx(5.0)  # 10e12 FLOP/s / 2e12 B/s
    assert plan.bound(4.9, 5.0) == "memory"
    assert plan.bound(5.0, 5.0) == "compute"
    # 1 MB at 100 GB/s = 10 us; 2 GFLOP at 1 TFLOP/s = 2 ms: the FLOPs bound it
    assert plan.roofline_s(2e9, 1e6, 1.0, 100.0) == pytest.approx(2e-3)
    assert plan.roofline_s(1e3, 1e6, 1.0, 100.0) == pytest.approx(1e-5)
    assert plan.ceiling(4e-3, 2e-3) == pytest.approx(2.0)
    assert plan.ceiling(1e-3, 2e-3) == 1.0  # already faster than the roofline says: no headroom claimed


def test_peak_tflops_falls_back_to_float32():
    assert plan.peak_tflops({"matmul_tflops": {"float32": 2.0, "float16": 8.0}}, "float16") == (8.0, "float16")
    assert plan.peak_tflops({"matmul_tflops": {"float32": 2.0}}, "bfloat16") == (2.0, "float32")


def _group(kernel_type, dims, time_ms, share, calls=1, dtype="float32"):
    return {"kernel_type": kernel_type, "op": f"aten::{kernel_type}", "shapes": [list(dims.values())],
            "dtype": dtype, "dims": dims, "target": f"{kernel_type}[x]", "route": "op", "calls": calls,
            "time_ms": time_ms, "share": share, "modules": [], "ops": []}


def _profile(groups, device="cpu"):
    total = sum(g["time_ms"] for g in groups)
    return Profile(device=device, device_name="cpu", dtype="float32", total_ms=total, forward_ms=total,
                   profiled_forward_ms=total, iters=1, warmup=0, groups=groups)


def test_plan_figures_by_hand():
    # softmax 1024x1024 fp32: bytes 2*M*N*4 = 8388608, flops 5*M*N = 5242880 -> 0.625 FLOP/B < 10: memory.
    # roofline 8388608 B / 100 GB/s = 83.88608 us; measured 4x that -> ceiling 4.
    softmax_ms = 4 * 0.08388608
    # matmul 1024^3 fp32: 2.147e9 FLOP, 12.58 MB -> 170.7 FLOP/B: compute; roofline 2.147 ms; measured 2x.
    matmul_ms = 2 * 2 * 1024**3 / 1e12 * 1e3
    other_ms = softmax_ms
    total = softmax_ms + matmul_ms + other_ms
    groups = [_group("softmax", {"M": 1024, "N": 1024}, softmax_ms, softmax_ms / total),
              _group("matmul", {"M": 1024, "K": 1024, "N": 1024}, matmul_ms, matmul_ms / total),
              {**_group("other", {}, other_ms, other_ms / total), "target": None, "dtype": ""}]
    result = plan.make_plan(_profile(groups), PEAKS)
    rows = {r["kernel_type"]: r for r in result["entries"]}
    sm, mm = rows["softmax"], rows["matmul"]
    assert sm["bound"] == "memory" and mm["bound"] == "compute"
    assert sm["ceiling_speedup"] == pytest.approx(4.0)
    assert mm["ceiling_speedup"] == pytest.approx(2.0)
    assert sm["roofline_us"] == pytest.approx(83.88608)
    p_sm, p_mm = softmax_ms / total, matmul_ms / total
    assert sm["projected_e2e_speedup"] == pytest.approx(1 / ((1 - p_sm) + p_sm / 4))
    assert mm["projected_e2e_speedup"] == pytest.approx(1 / ((1 - p_mm) + p_mm / 2))
    assert result["total_ceiling_e2e_speedup"] == pytest.approx(1 / (1 - p_sm * 0.75 - p_mm * 0.5))
    assert rows["other"]["bound"] is None and rows["other"]["ceiling_speedup"] == 1.0
    # ranked by projected gain, other last
    gains = [r["projected_e2e_speedup"] for r in result["entries"][:-1]]
    assert gains == sorted(gains, reverse=True)
    assert [r["rank"] for r in result["entries"]] == [1, 2, 3] and result["entries"][-1]["kernel_type"] == "other"
    assert result["coverage"] == pytest.approx(1 - other_ms / total)
    assert math.isclose(sum(r["share"] for r in result["entries"]), 1.0)


def test_ranking_prefers_headroom_over_raw_time():
    # a small group far from its roofline can be worth more than a big one already at it
    mm_ms = 2 * 1024**3 / 1e12 * 1e3  # exactly at the roofline: ceiling 1
    sm_ms = 10 * 0.08388608  # 10x from the roofline
    total = mm_ms + sm_ms
    groups = [_group("matmul", {"M": 1024, "K": 1024, "N": 1024}, mm_ms, mm_ms / total),
              _group("softmax", {"M": 1024, "N": 1024}, sm_ms, sm_ms / total)]
    result = plan.make_plan(_profile(groups), PEAKS)
    assert result["entries"][0]["kernel_type"] == "softmax"
    assert result["entries"][1]["ceiling_speedup"] == pytest.approx(1.0)


def test_cpu_figures_are_labelled():
    groups = [_group("softmax", {"M": 8, "N": 8}, 1.0, 1.0)]
    on_cpu = plan.make_plan(_profile(groups, "cpu"), PEAKS)
    assert on_cpu["device"] == "cpu" and on_cpu["cpu_figures"] is True and "CPU" in on_cpu["note"]
    on_gpu = plan.make_plan(_profile(groups, "cuda"), PEAKS)
    assert on_gpu["cpu_figures"] is False and "note" not in on_gpu


def test_table_renders_every_row():
    from rich.console import Console

    groups = [_group("softmax", {"M": 8, "N": 8}, 0.75, 0.75),
              {**_group("other", {}, 0.25, 0.25), "target": None,
               "other_ops": [{"op": "aten::add", "time_ms": 0.25, "share": 0.25, "calls": 3}]}]
    console = Console(width=150, record=True)
    console.print(plan.table(plan.make_plan(_profile(groups), PEAKS)))
    text = console.export_text()
    assert "softmax[x]" in text and "other: add" in text and "CPU figures" in text
    assert "75.0%" in text and "25.0%" in text


def test_peaks_lower_than_what_ran_are_flagged():
    # a softmax that took half its roofline time: the peaks must have been measured too low
    half_ms = 0.5 * 0.08388608
    result = plan.make_plan(_profile([_group("softmax", {"M": 1024, "N": 1024}, half_ms, 1.0)]), PEAKS)
    assert result["entries"][0]["ceiling_speedup"] == 1.0
    assert "softmax[x] moved its bytes faster than the copy probe's 100 GB/s" in result["warnings"][0]
    assert "delete" not in result["warnings"][0]  # nothing for the user to do by hand
    fine = plan.make_plan(_profile([_group("softmax", {"M": 1024, "N": 1024}, 4 * 0.08388608, 1.0)]), PEAKS)
    assert "warnings" not in fine


def test_a_bf16_model_on_an_h200_is_planned_against_the_bf16_peaks():
    """The recorded CUDA profile of the bf16 LlamaTiny with the H200's measured peaks: every group
    uses matmul_tflops["bfloat16"]; fused_mlp gets a ceiling instead of the float32 roof's 1x."""
    import json
    from pathlib import Path

    from autokernel.profile.profiler import attribute
    from autokernel.profile.records import Records
    data = DATA
    peaks = json.loads((data / "h200_peaks.json").read_text())
    groups = attribute(Records.load(data / "cuda_profile_llama_tiny_bf16.json"), {})
    total = sum(g["time_ms"] for g in groups)
    profile = Profile(device="cuda", device_name="NVIDIA H200", dtype="bfloat16", total_ms=total, forward_ms=total,
                      profiled_forward_ms=total, iters=1, warmup=0, groups=groups)
    result = plan.make_plan(profile, peaks)
    named = [e for e in result["entries"] if e["kernel_type"] not in ("other", "module")]
    assert named and all(e["peak_dtype"] == "bfloat16" and e["target"].endswith(":bfloat16]") for e in named)
    mlp = next(e for e in named if e["kernel_type"] == "fused_mlp")
    dims = mlp["dims"]
    assert mlp["flops"] >= 6 * dims["M"] * dims["D"] * dims["F"] and mlp["bound"] == "compute"
    assert mlp["roofline_us"] == pytest.approx(mlp["flops"] / (peaks["matmul_tflops"]["bfloat16"] * 1e12) * 1e6)
    assert mlp["ceiling_speedup"] == pytest.approx(mlp["per_call_us"] / mlp["roofline_us"]) and mlp["ceiling_speedup"] > 1


def test_a_matmul_above_the_compute_roof_names_the_roof_and_its_rate_is_what_raises_it():
    # matmul 1024^3 fp32: 2*1024^3 = 2147483648 FLOP, 12582912 B -> 170.7 FLOP/B: compute-bound at a
    # 1 TFLOP/s roof (2147.48 us); it ran in 1073.74 us: 2 TFLOP/s
    dims = {"M": 1024, "K": 1024, "N": 1024}
    profile = _profile([_group("matmul", dims, 1.073741824, 1.0)])
    assert plan.achieved_tflops(profile) == pytest.approx({"float32": 2.0})
    result = plan.make_plan(profile, PEAKS)
    assert "matmul[x] ran faster than the float32 peak of 1 TFLOP/s" in result["warnings"][0]
    raised = plan.make_plan(profile, {**PEAKS, "matmul_tflops": {"float32": 2.0}, "raised": {"float32": {}}})
    assert "warnings" not in raised and "float32" in raised["peaks_raised"]
    assert plan.achieved_tflops(_profile([_group("other", {}, 1.0, 1.0)])) == {}


def _module_group(time_ms, share, work="counted", flops=1e6, nbytes=1e6):
    return {"kernel_type": "module", "op": "M.forward", "shapes": [[4, 8]], "dtype": "float32", "dims": {},
            "target": f"module[M.{work}:4x8:float32]", "route": "module", "calls": 1, "time_ms": time_ms,
            "share": share, "modules": [], "ops": ["mylib::op"], "flops": flops, "bytes": nbytes, "work": work,
            "work_note": "the work of mylib::op (90% of this target's time) could not be counted"}


def test_a_target_whose_work_is_a_floor_gets_no_ceiling_and_ranks_by_its_share_alone():
    # softmax: ceiling 4 (see test_plan_figures_by_hand), share 0.5 -> 1 / (0.5 + 0.125) = 1.6 end to end
    # a floor of 30%: at best 1 / 0.7 = 1.43 end to end, ranked after it; one of 5%: 1.05, after a
    # counted module of 15% with 1 MB at 100 GB/s = 10 us against 30 us measured: ceiling 3, 1.11
    sm_ms = 4 * 0.08388608
    total = 2 * sm_ms
    groups = [_group("softmax", {"M": 1024, "N": 1024}, sm_ms, 0.5),
              _module_group(0.3 * total, 0.3, "floor"), _module_group(0.05 * total, 0.05, "floor"),
              {**_module_group(0.15 * total, 0.15), "time_ms": 0.03, "target": "module[M.counted:4x8:float32]"}]
    result = plan.make_plan(_profile(groups), PEAKS)
    order = [(r["target"], r["ceiling_speedup"]) for r in result["entries"]]
    assert [t for t, _ in order] == ["softmax[x]", "module[M.floor:4x8:float32]", "module[M.counted:4x8:float32]",
                                     "module[M.floor:4x8:float32]"]
    floor = result["entries"][1]
    assert floor["ceiling_speedup"] is None and floor["projected_e2e_speedup"] is None and floor["bound"] is None
    assert floor["work"] == "floor" and floor["ceiling_note"].startswith("no ceiling: the work of mylib::op")
    assert result["entries"][2]["ceiling_speedup"] == pytest.approx(3.0) and result["entries"][2]["work"] == "counted"
    # the total ceiling counts the counted targets only, and says how much it leaves out
    assert result["total_ceiling_e2e_speedup"] == pytest.approx(1 / (1 - 0.5 * 0.75 - 0.15 * (1 - 1 / 3)))
    assert result["uncounted_share"] == pytest.approx(0.35)


def test_a_module_with_no_bytes_recorded_claims_no_ceiling():
    (row,) = plan.make_plan(_profile([_module_group(1.0, 1.0, nbytes=0)]), PEAKS)["entries"]
    assert row["ceiling_speedup"] is None and row["ceiling_note"] == "no ceiling: no bytes were recorded for it"


def test_causal_attention_is_charged_the_half_of_the_scores_it_computes():
    dims = {"B": 1, "H": 4, "S": 1024, "D": 64}
    full = plan.entry(_group("flash_attention", dims, 1.0, 0.5), PEAKS)
    causal = plan.entry({**_group("flash_attention", dims, 1.0, 0.5), "causal": True}, PEAKS)
    assert full["flops"] == 4 * 4 * 1024 * 1024 * 64 == 2 * causal["flops"]


def test_a_plan_written_before_work_was_counted_still_reads(tmp_path):
    """plan.json of a recorded H200 run: every row with a number for a ceiling and no `work` or
    `uncounted_share`; the table, the report and the run's targets read it as they did."""
    import json
    from pathlib import Path

    from rich.console import Console

    from autokernel.deploy.report import _plan
    from autokernel.search.start import pick_targets
    old = json.loads((DATA / "h200_plan_llama_tiny_bf16.json").read_text())
    console = Console(width=200, record=True)
    console.print(plan.table(old))
    shown = console.export_text()
    assert "8.1x" in shown and "n/a" not in shown and "1.41x end to end." in shown
    report = "\n".join(_plan(old))
    assert "| 8.12x | 1.171x |" in report and "n/a" not in report
    targets = pick_targets(old, 3)
    assert [t.ceiling_speedup for t in targets] == [e["ceiling_speedup"] for e in old["entries"][:3]]


def test_module_targets_of_recorded_gpu_records_without_the_models_calls_claim_no_ceiling():
    """The recorded CUDA profile attributed again without the model: its module targets' ops are
    counted (an embedding computes nothing), but with no captured calls their bytes are unknown, so
    they claim no ceiling, say why, and stay out of the total; the typed rows keep theirs."""
    import json
    from pathlib import Path

    from autokernel.profile.profiler import attribute
    from autokernel.profile.records import Records
    data = DATA
    groups = attribute(Records.load(data / "cuda_profile_llama_tiny_bf16.json"), {})
    total = sum(g["time_ms"] for g in groups)
    profile = Profile(device="cuda", device_name="NVIDIA H200", dtype="bfloat16", total_ms=total, forward_ms=total,
                      profiled_forward_ms=total, iters=1, warmup=0, groups=groups)
    result = plan.make_plan(profile, json.loads((data / "h200_peaks.json").read_text()))
    modules = [e for e in result["entries"] if e["kernel_type"] == "module"]
    typed = [e for e in result["entries"] if e["kernel_type"] not in ("module", "other")]
    assert modules and all(e["ceiling_speedup"] is None and "not captured" in e["ceiling_note"] for e in modules)
    assert next(e for e in modules if "aten::embedding" in e["ops"])["flops"] == 0
    assert typed and all(e["ceiling_speedup"] >= 1.0 and e["work"] == "counted" for e in typed)
    assert result["uncounted_share"] == pytest.approx(sum(e["share"] for e in modules))
    assert result["total_ceiling_e2e_speedup"] == pytest.approx(
        plan.amdahl_many((e["share"], e["ceiling_speedup"]) for e in typed))
