"""Whether a kernel timed on the CPU would fill the target GPU: CPU timings do not choose for a GPU.

The Triton interpreter runs a launch's programs one after another, each a few numpy calls, so on
the CPU fewer, bigger programs are faster: one program over all 16 rows of a softmax timed 14 ms
against 87 to 95 ms for one program per row (docs/judge.md). On an H100 the first uses one of 132
multiprocessors. A search
that keeps kernels for their CPU speed learns the interpreter, not the GPU.

So every CPU verdict's timing carries the grid of its heaviest launch (the Triton kernel the timed
calls spent the most interpreter time in: the worker records each launch's programs and seconds),
and the rule: that launch has at least min(SMs of the target, units of work at the target shape)
programs that work (store at least one element, or run an atomic: a grid of 132 programs of which
131 return at once and one does every row fills one multiprocessor), where a unit is what a GPU kernel of the type gives one program at the least:
- a row (softmax, layernorm, rmsnorm, reduce, cross_entropy: all leading dims);
- a (batch, position) of rotary_embedding, every head of it;
- a 128 x 128 tile of matmul's output, of fused_mlp's [M, F] intermediate;
- 128 query rows of one (batch, head) of flash_attention.
A verdict that fails it still PASSes (a correct kernel is correct); the search does not keep it for
its CPU speed (autokernel/search/decision.py). A kernel that sizes its grid by the device it runs
on (a persistent kernel: one program per multiprocessor on a GPU, a few on the CPU) cannot show on
the CPU the grid it would launch on a GPU, and is kept for speed only where it is timed on one.
"""
from __future__ import annotations

import math

# multiprocessors of the GPU each architecture names here (its datacenter part)
SMS = {"sm_80": 108, "sm_86": 84, "sm_89": 142, "sm_90": 132, "sm_100": 148}
DEFAULT_ARCH = "sm_90"
TILE = 128  # rows (and columns) of one program's output tile in the tiled types


def units(kernel_type: str, dims: dict) -> int:
    """Units of work at `dims` a GPU kernel of this type spreads over its programs (see above)."""
    d = dims
    if kernel_type == "matmul":
        return math.ceil(d["M"] / TILE) * math.ceil(d["N"] / TILE)
    if kernel_type == "fused_mlp":
        return math.ceil(d["M"] / TILE) * math.ceil(d["F"] / TILE)
    if kernel_type == "flash_attention":
        return d["B"] * d["H"] * math.ceil(d["S"] / TILE)
    if kernel_type in ("rotary_embedding", "rotary_qk"):
        return d["B"] * d["S"]
    if kernel_type == "linear_cross_entropy":  # the logits' tiles a chunked kernel computes
        return math.ceil(d["N"] / TILE) * math.ceil(d["V"] / TILE)
    if kernel_type == "cross_entropy":
        return d["N"]
    return max(1, math.prod(v for k, v in d.items() if k != "N"))  # the row-wise types: every leading dim


def heaviest(grids: list) -> dict | None:
    """From the timed launches' (kernel, programs, seconds[, programs that stored anything]): the kernel
    they spent the most time in, with its largest grid and the most programs of a launch that worked;
    None when nothing was launched through the interpreter."""
    total: dict[str, list] = {}
    for name, programs, seconds, *working in grids:
        entry = total.setdefault(name, [0.0, 0, 0, 0])
        entry[0] += seconds
        entry[1] = max(entry[1], programs)
        entry[2] += 1
        entry[3] = max(entry[3], working[0] if working else programs)
    if not total:
        return None
    name, (seconds, programs, launches, working) = max(total.items(), key=lambda kv: kv[1][0])
    return {"kernel": name, "programs": programs, "launches": launches, "seconds": seconds, "working": working}


def recorded(events: list[dict]) -> dict | None:
    """The grid the worker recorded with the target's timing (its stage_end), or None."""
    for e in events:
        if e.get("event") == "stage_end" and e.get("stage") == "timing" and e.get("status") == "pass":
            return e.get("grid")
    return None


def assess(case, grid: dict | None, arch: str) -> dict:
    """The verdict's timing["grid"]: the heaviest launch's programs against what would fill `arch`'s
    GPU at the timed case's shape; `fills_target` False keeps the search from keeping it for speed."""
    sms = SMS.get(arch, SMS[DEFAULT_ARCH])
    need = min(sms, units(case.kernel_type, case.dims))
    rule = (f"programs of the heaviest launch that store anything >= min({sms} multiprocessors of {arch if arch in SMS else DEFAULT_ARCH}, "
            f"{units(case.kernel_type, case.dims)} units of work at {case.label()})")
    if grid is None:
        return {"fills_target": False, "needed": need, "rule": rule,
                "detail": "no launch was seen through the interpreter while timed"}
    working = grid.get("working", grid["programs"])
    fills = working >= need
    idle = (f", {working} of which stored anything (the others returned without work)"
            if working < grid["programs"] else "")
    detail = (f"{grid['kernel']} ran {grid['programs']} program(s) per launch{idle}; "
              + ("enough to fill the target GPU" if fills else
                 f"{need} working would fill the target GPU: its CPU time does not choose for a GPU, so the "
                 "search does not keep it for speed"))
    return {"fills_target": fills, "needed": need, "rule": rule, "detail": detail, "working": working,
            **{k: grid[k] for k in ("kernel", "programs", "launches")}}
