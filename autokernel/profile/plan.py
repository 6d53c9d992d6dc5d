"""The Amdahl plan: what each bottleneck could be worth end to end.

For each group of the profile: its arithmetic intensity (the registry's FLOPs / bytes for its dims
and dtype) against the ridge point of the device's measured peaks says whether it is memory- or
compute-bound; its roofline time is max(bytes / peak bandwidth, flops / peak compute); its ceiling
speedup is how far eager already is from that roofline (measured / roofline, at least 1); Amdahl's
law turns a share p made s times faster into 1 / ((1 - p) + p / s) end to end. Groups are ranked by
that projected gain. A module target's FLOPs and bytes are counted op by op by the profiler; where
that count is a floor (work no formula covers), the row claims no ceiling (None, with the reason in
`ceiling_note`), is ranked by its share alone, and the total ceiling leaves it out.

A training step's plan (the profile's `train`) ranks each target by its forward plus backward
time (`fwd_ms`, `bwd_ms`); a row with a backward is charged three times its forward's work at the
roofline, the usual count: a product's backward is two products (one for the input's gradient, one
for the weight's), a row-wise op's reads its input and the upstream gradient and writes a gradient.
The optimizer step is shown apart (`train.optimizer_ms`): no target covers it, so it is outside
the shares and every projection.

On a CPU every figure is a CPU figure (timings and peaks of this CPU) and is labelled so.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from autokernel.profile.attribution import UNLINKED
from harness.kernel_types import registry

BACKWARD_WORK = 2.0  # a backward's work in forwards (see above)
CPU_NOTE = ("CPU figures: times and peaks were measured on this CPU; they rank this CPU's "
            "bottlenecks and say nothing about a GPU")


def amdahl(p: float, s: float) -> float:
    """End-to-end speedup when a share p of the time runs s times faster."""
    return 1.0 / ((1.0 - p) + p / s)


def amdahl_many(pairs: Iterable[tuple[float, float]]) -> float:
    """End-to-end speedup when each share p_i runs s_i times faster (shares do not overlap)."""
    return 1.0 / (1.0 - sum(p * (1.0 - 1.0 / s) for p, s in pairs))


def ridge(tflops: float, gbps: float) -> float:
    """The ridge point in FLOP per byte: below it a kernel cannot be compute-bound."""
    return tflops * 1e12 / (gbps * 1e9)


def bound(intensity: float, ridge_flop_per_byte: float) -> str:
    return "compute" if intensity >= ridge_flop_per_byte else "memory"


def roofline_s(flops: float, nbytes: float, tflops: float, gbps: float) -> float:
    """The least time the roofline allows: the slower of moving the bytes and doing the FLOPs."""
    return max(nbytes / (gbps * 1e9), flops / (tflops * 1e12))


def ceiling(measured_s: float, roofline: float) -> float:
    """How many times faster than measured a kernel at the roofline would be; at least 1."""
    return max(1.0, measured_s / roofline) if roofline > 0 else 1.0


def peak_tflops(peaks: dict, dtype: str) -> tuple[float, str]:
    """The compute roof for a dtype and the dtype it was measured for (float32 when the device
    could not run the dtype's matmul)."""
    table = peaks.get("matmul_tflops", {})
    if dtype in table:
        return table[dtype], dtype
    return table.get("float32", max(table.values(), default=1.0)), "float32"


def entry(group: Any, peaks: dict) -> dict:
    """One ranked row of the plan: the group's profile plus its roofline figures. A module target
    whose work could not be counted gets no ceiling and no projection (None), and says why."""
    row = {**group, "bound": None, "ceiling_speedup": 1.0, "projected_e2e_speedup": 1.0}
    if group["kernel_type"] == "other" or not group["calls"]:
        return row
    if group["kernel_type"] == "module":
        # counted op by op from the recorded shapes (autokernel.profile.op_work), bytes from the module's calls
        flops, nbytes = float(group.get("flops") or 0), float(group.get("bytes") or 0)
        if group.get("work") == "floor" or nbytes <= 0:
            note = group.get("work_note") if group.get("work") == "floor" else "no bytes were recorded for it"
            return {**row, "work": "floor", "ceiling_speedup": None, "projected_e2e_speedup": None,
                    "ceiling_note": f"no ceiling: {note}"}
    else:
        kt = registry.get(group["kernel_type"])
        element_size = registry.dtype_of(group["dtype"]).itemsize if group["dtype"] in registry.DTYPES else 4
        flops, nbytes = kt.flops(group["dims"]), kt.bytes(group["dims"], element_size)
        if group.get("causal"):
            flops /= 2  # a causal mask leaves half the scores: the judge's roofline counts it so too
    if group.get("bwd_ms"):
        flops, nbytes = flops * (1 + BACKWARD_WORK), nbytes * (1 + BACKWARD_WORK)
    tflops, tflops_dtype = peak_tflops(peaks, group["dtype"])
    roof = roofline_s(flops, nbytes, tflops, peaks["copy_gbps"])
    per_call_s = group["time_ms"] / 1e3 / group["calls"]
    s = ceiling(per_call_s, roof)
    row.update({
        "work": "counted",
        "bound": bound(flops / nbytes, ridge(tflops, peaks["copy_gbps"])),
        "ceiling_speedup": s,
        "projected_e2e_speedup": amdahl(group["share"], s),
        "flops": flops, "bytes": nbytes, "intensity_flop_per_byte": flops / nbytes,
        "per_call_us": per_call_s * 1e6, "roofline_us": roof * 1e6, "peak_dtype": tflops_dtype,
    })
    return row


def achieved_tflops(profile: Any) -> dict[str, float]:
    """The most TFLOP/s any group reached, per dtype: no roof can be lower than what ran."""
    best: dict[str, float] = {}
    for g in profile.groups:
        if g["kernel_type"] in ("other", "module") or not g["calls"] or not g["time_ms"] or g["dtype"] not in registry.DTYPES:
            continue
        rate = registry.get(g["kernel_type"]).flops(g["dims"]) * g["calls"] / (g["time_ms"] / 1e3) / 1e12
        best[g["dtype"]] = max(best.get(g["dtype"], 0.0), rate)
    return best


def rank_gain(row: dict) -> float:
    """What a row is ranked by: its projected end-to-end gain; for a target whose work could not be
    counted, its share alone, as the most that share could be worth (Amdahl with an infinite speedup)."""
    if row["projected_e2e_speedup"] is not None:
        return row["projected_e2e_speedup"]
    return 1.0 / (1.0 - row["share"]) if row["share"] < 1.0 else float("inf")


def make_plan(profile: Any, peaks: dict, model: dict | None = None) -> dict:
    """The profile JSON of DESIGN.md: groups ranked by projected end-to-end gain. The total ceiling
    counts only targets with a counted ceiling; `uncounted_share` is the share it leaves out."""
    rows = sorted((entry(g, peaks) for g in profile.groups),
                  key=lambda r: (r["kernel_type"] == "other", -rank_gain(r), -r["time_ms"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    counted = [r for r in rows if r["kernel_type"] != "other" and r["ceiling_speedup"] is not None]
    on_cpu = not profile.device.startswith("cuda")
    plan = {
        "device": "cpu" if on_cpu else profile.device,
        "device_name": peaks.get("device", profile.device_name),
        "dtype": profile.dtype,
        "total_ms": profile.total_ms,
        "coverage": profile.coverage,
        "typed_coverage": getattr(profile, "typed_coverage", profile.coverage),
        "entries": [_ordered(r) for r in rows],
        "total_ceiling_e2e_speedup": amdahl_many((r["share"], r["ceiling_speedup"]) for r in counted),
        "uncounted_share": sum(r["share"] for r in rows if r["kernel_type"] != "other" and r["ceiling_speedup"] is None),
        "cpu_figures": on_cpu,
        "forward_ms": profile.forward_ms,
        "profiled_forward_ms": profile.profiled_forward_ms,
        "iters": profile.iters,
        "warmup": profile.warmup,
        "peaks": peaks,
        "ridge_flop_per_byte": {d: ridge(t, peaks["copy_gbps"]) for d, t in peaks.get("matmul_tflops", {}).items()},
    }
    if on_cpu:
        plan["note"] = CPU_NOTE
    plan["warnings"] = _faster_than_peaks(rows, peaks)
    if not plan["warnings"]:
        del plan["warnings"]
    if peaks.get("raised"):
        plan["peaks_raised"] = (f"peaks raised to what the profile's ops reached "
                                f"({', '.join(sorted(peaks['raised']))}): the cached probe read low")
    if model is not None:
        plan["model"] = model
    if getattr(profile, "train", None):
        plan["train"] = train_summary(profile.train, rows, profile.total_ms)
    if getattr(profile, "chains", None):
        plan["chains"] = ranked_chains(profile.chains, peaks, BACKWARD_WORK, plan["entries"])
    return plan


# ---------------------------------------------------------------- chains (autokernel.profile.chain_plan)
def chain_price(row: dict, peaks: dict, backward_work: float) -> dict:
    """The row's ceiling (measured time against the fused roofline) and projection by Amdahl."""
    if not row["calls"] or row["time_ms"] <= 0 or row["unmeasured_ops"]:
        why = (f"its ops {', '.join(row['unmeasured_ops'])} are not in the profile's records"
               if row["unmeasured_ops"] else "no measured time")
        return {**row, "ceiling_speedup": None, "projected_e2e_speedup": None, "ceiling_note": f"no ceiling: {why}"}
    scale = 1 + backward_work if row["bwd_ms"] > 0 else 1
    tflops, _ = peak_tflops(peaks, row["dtype"])
    roof = roofline_s(row["flops"] * scale, row["fused_bytes"] * scale, tflops, peaks["copy_gbps"])
    per_call_s = row["time_ms"] / 1e3 / row["calls"]
    s = ceiling(per_call_s, roof)
    return {**row, "per_call_us": per_call_s * 1e6, "roofline_us": roof * 1e6, "ceiling_speedup": s,
            "projected_e2e_speedup": amdahl(min(row["share"], 1.0), s)}


def ranked_chains(chains: dict, peaks: dict, backward_work: float, entries: Optional[list] = None) -> dict:
    """The chains priced and ranked; each names its `members`: the targets of `entries` it is an
    alternative to."""
    from autokernel.profile.chain_plan import members
    rows = [{**chain_price(r, peaks, backward_work), "members": members(r, entries or [])}
            for r in chains.get("entries", [])]
    rows.sort(key=lambda r: -(r["projected_e2e_speedup"] or 0.0))
    return {**chains, "entries": rows}



def train_summary(train: dict, rows: list[dict], total_ms: float) -> dict:
    """A training step's plan header: its loss and optimizer, the forward and backward totals, and
    the optimizer step, timed apart (None where the records held none)."""
    opt = train.get("optimizer_ms")
    step_ms = total_ms + (opt or 0.0)
    return {**train, "forward_ms": sum(r.get("fwd_ms", 0.0) for r in rows),
            "backward_ms": sum(r.get("bwd_ms", 0.0) for r in rows), "step_ms": step_ms,
            "optimizer_share_of_step": (opt / step_ms) if opt is not None and step_ms > 0 else None,
            "backward_work": f"a row with a backward is charged {1 + BACKWARD_WORK:g}x its forward's work at the roofline"}


def _faster_than_peaks(rows: list[dict], peaks: dict) -> list[str]:
    """Groups that ran faster than a roof allows. Above the copy probe's bandwidth: the group's data
    stays in the caches (the probe's buffer is far larger). Above a compute roof: the roof was
    probed low; measured_peaks(at_least=achieved_tflops(profile)) raises it before planning."""
    warnings = []
    for r in rows:
        if not r.get("roofline_us") or r["per_call_us"] >= 0.9 * r["roofline_us"]:
            continue
        if r["bytes"] / (peaks["copy_gbps"] * 1e9) * 1e6 * 0.9 > r["per_call_us"]:
            warnings.append(f"{r['target']} moved its bytes faster than the copy probe's {peaks['copy_gbps']:.4g} GB/s: "
                            "its data likely stays in the caches, so its ceiling reads 1x")
        else:
            warnings.append(f"{r['target']} ran faster than the {r['peak_dtype']} peak of "
                            f"{peak_tflops(peaks, r['dtype'])[0]:.4g} TFLOP/s: that peak was probed low")
    return warnings


FIRST_KEYS = ("rank", "kernel_type", "op", "shapes", "dtype", "calls", "time_ms", "fwd_ms", "bwd_ms", "share", "bound",
              "ceiling_speedup", "projected_e2e_speedup", "ceiling_note", "target", "dims", "work")


def _ordered(row: dict) -> dict:
    return {**{k: row[k] for k in FIRST_KEYS if k in row}, **row}


# ---------------------------------------------------------------- rendering
def table(plan: dict, max_rows: int = 20) -> Any:
    """The plan as a rich Table: rank, target, where, share, bound, ceiling, projected gain."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    label = " (CPU figures)" if plan.get("cpu_figures") else ""
    train = plan.get("train")
    per = "training step (forward + backward; the optimizer step apart)" if train else "forward"
    t = Table(title=f"{plan['device_name']}{label}: {plan['total_ms']:.2f} ms of device time per {per}",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    split = ("fwd ms", "bwd ms") if train else ()
    for name in ("#", "target", "where", "calls", "ms", *split, "share", "bound", "ceiling", "e2e"):
        t.add_column(name, justify="left" if name in ("target", "where", "bound") else "right")
    for row in plan["entries"][:max_rows]:
        times = [f"{row.get(k, 0.0):.3f}" for k in ("fwd_ms", "bwd_ms")] if train else []
        # targets look like markup ("softmax[64x1024:fp32]"): escape them
        t.add_row(str(row["rank"]), escape(_what(row)), escape(_where(row)), f"{row['calls']:g}", f"{row['time_ms']:.3f}",
                  *times, f"{row['share']:.1%}", row["bound"] or "", *ceiling_cells(row, "{:.1f}x", "{:.3f}x"))
        for part in row.get("parts", []):
            if part["kernel_type"] != "other":
                t.add_row("", escape(f" └ {_short(part['target'])}"), "", f"{part['calls']:g}", f"{part['time_ms']:.3f}",
                          *[""] * len(split), f"{part['share']:.1%}", "", "", "", style="dim")
    typed = plan.get("typed_coverage", plan["coverage"])
    t.caption = (f"{plan['coverage']:.1%} of the time in targets ({typed:.1%} in the nine kernel types, "
                 f"{plan['coverage'] - typed:.1%} in module targets, searched by the LLM agent). ceiling: the group's speedup at "
                 f"the roofline; e2e: the model's, by Amdahl. All mapped groups at their ceilings: "
                 f"{plan['total_ceiling_e2e_speedup']:.2f}x end to end{uncounted_clause(plan)}."
                 + (train_caption(train) if train else "")
                 + "".join(f"\n{n}" for n in ceiling_notes(plan["entries"][:max_rows]))
                 + (f"\n{plan['note']}." if plan.get("note") else "")
                 + (f"\n{plan['peaks_raised']}." if plan.get("peaks_raised") else "")
                 + "".join(f"\nwarning: {w}" for w in plan.get("warnings", [])))
    t.caption_justify = "left"
    return t


def train_caption(train: dict) -> str:
    """What a training step's plan was measured on, and its optimizer step, shown apart."""
    text = (f"\ntraining step: the loss is {train['step']}; forward {train['forward_ms']:.3f} ms, backward "
            f"{train['backward_ms']:.3f} ms; {train['backward_work']}.")
    if train.get("optimizer_ms") is None:
        return text + f"\noptimizer step ({train['optimizer']}): not in the records."
    return text + (f"\noptimizer step ({train['optimizer']}): {train['optimizer_ms']:.3f} ms more, "
                   f"{train['optimizer_share_of_step']:.1%} of the {train['step_ms']:.3f} ms step; no target "
                   "covers it, so it is outside the shares and the projections.")


def ceiling_cells(row: dict, ceiling_fmt: str, e2e_fmt: str) -> tuple[str, str]:
    """The ceiling and e2e cells of a row: blank for `other`, n/a where the work was not counted."""
    if row["kernel_type"] == "other":
        return "", ""
    if row.get("ceiling_speedup") is None:
        return "n/a", "n/a"
    return ceiling_fmt.format(row["ceiling_speedup"]), e2e_fmt.format(row["projected_e2e_speedup"])


def uncounted_clause(plan: dict) -> str:
    share = plan.get("uncounted_share") or 0.0
    return f" (leaving out the {share:.1%} of the time whose work could not be counted: n/a)" if share > 0 else ""


def ceiling_notes(rows: list[dict], limit: int = 3) -> list[str]:
    """Why the first rows without a ceiling have none (their ceiling_note)."""
    missing = [r for r in rows if r["kernel_type"] != "other" and r.get("ceiling_speedup") is None]
    notes = [f"n/a: {_short(r['target'])}: {r.get('ceiling_note') or 'its work could not be counted'}"
             for r in missing[:limit]]
    return notes + ([f"n/a: {len(missing) - limit} more, see the JSON's ceiling_note"] if len(missing) > limit else [])


def _short(target: str) -> str:
    for name, short in (("float32", "fp32"), ("float16", "fp16"), ("bfloat16", "bf16")):
        target = target.replace(f":{name}]", f":{short}]")
    return target


def _what(row: dict) -> str:
    if row["kernel_type"] == "other":
        head = row["op"] if row["op"] == UNLINKED else "other"
        return f"{head}: " + ", ".join(o["op"].replace("aten::", "") for o in row.get("other_ops", [])[:3])
    return _short(row["target"]) + (" causal" if row.get("causal") else "")


def _where(row: dict) -> str:
    classes: dict[str, int] = {}
    for m in row.get("modules", []):
        classes[m["class"]] = classes.get(m["class"], 0) + 1
    return ", ".join(f"{c} x{n}" if n > 1 else c for c, n in classes.items())
