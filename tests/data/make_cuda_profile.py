"""Writes cuda_profile_llama_tiny_bf16.json: the records a CUDA profile of the bf16 LlamaTiny of the
H200 run (LlamaTiny(32000, 2048, 2, 16, 5632), tokens (4, 512)) holds, without a GPU.

The CPU-side op records are real: the model runs on the meta device under the same profiler and
module hooks as `autokernel profile`, so names, shapes, dtypes and constant arguments are what
torch records. The device side is modelled on what a CUDA profile holds: every op that computes
launches one kernel through a cudaLaunchKernel runtime call inside its range; half the kernels carry
the launching op's id, the other half only the launch's correlation id. Kernel times are derived
from each op's bytes and FLOPs at H200-like rates, so the fixture is deterministic.

    PYTHONPATH=. python tests/data/make_cuda_profile.py
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

from autokernel.profile.profiler import ROOT, _hook_modules
from autokernel.profile.records import DeviceEvent, Launch, Records, from_kineto

HERE = Path(__file__).parent
INIT_ARGS, TOKENS = (32000, 2048, 2, 16, 5632), (4, 512)
# Ops that launch nothing on a GPU: views and metadata.
NO_KERNEL = {"view", "reshape", "_reshape_alias", "_unsafe_view", "unsqueeze", "squeeze", "transpose", "t",
             "permute", "expand", "expand_as", "as_strided", "slice", "select", "narrow", "split", "unbind",
             "detach", "alias", "empty", "empty_like", "empty_strided", "size", "lift_fresh", "resolve_conj",
             "result_type", "contiguous", "to", "_to_copy", "empty_permuted", "new_empty"}
MATMULS = {"mm", "bmm", "addmm", "matmul", "linear"}
BYTES_PER_S, FLOPS_PER_S, LAUNCH_NS = 3.0e12, 5.0e14, 2000


def llama_tiny() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("llama_tiny", HERE.parent.parent / "examples" / "llama_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        return module.LlamaTiny(*INIT_ARGS).to(torch.bfloat16).eval()


def cpu_records(model: torch.nn.Module, iters: int = 1) -> Records:
    ids = torch.zeros(TOKENS, dtype=torch.long, device="meta")
    handles = _hook_modules(dict(model.named_modules()))
    try:
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                     record_shapes=True) as prof:
            for _ in range(iters):
                with torch.autograd.profiler.record_function(ROOT):
                    model(ids)
    finally:
        for h in handles:
            h.remove()
    records = from_kineto(prof.profiler.kineto_results, "cpu")
    # the meta device runs aten ops through their prims decompositions; CUDA runs them as kernels
    records.ops = [op for op in records.ops if not op.name.startswith("prims::")]
    return records


def kernel_ns(name: str, shapes: list) -> int:
    sizes = [math.prod(s) for s in shapes if s]
    kind = name.split("::")[-1]
    if kind in MATMULS and len(shapes) >= 2 and shapes[0] and shapes[1]:
        a, b = shapes[0], shapes[1]
        flops = 2 * math.prod(a) * (b[-1] if kind != "linear" else b[0])
        return LAUNCH_NS + int(flops / FLOPS_PER_S * 1e9)
    return LAUNCH_NS + int(2 * 2 * max(sizes, default=1) / BYTES_PER_S * 1e9)


def launchers(records: Records) -> list:
    """The ops that launch a kernel: aten ops that compute, below which nothing else computes."""
    def computes(op) -> bool:
        return op.name.startswith("aten::") and op.name.split("::")[-1] not in NO_KERNEL
    inner = {op.id for op in records.ops for other in records.ops
             if other is not op and computes(other) and other.thread == op.thread
             and op.start_ns <= other.start_ns and other.end_ns <= op.end_ns}
    return sorted((o for o in records.ops if computes(o) and o.id not in inner), key=lambda o: o.start_ns)


def cuda_style(records: Records) -> Records:
    out = Records("cuda", records.ops)
    clock = max(op.end_ns for op in records.ops)
    for i, op in enumerate(launchers(records)):
        correlation = 100_000 + i
        mid = (op.start_ns + op.end_ns) // 2
        linked = op.id if i % 2 == 0 else 0
        out.launches.append(Launch("cudaLaunchKernel", op.thread, mid, min(mid + 1, op.end_ns), correlation, linked))
        duration = kernel_ns(op.name, op.shapes)
        clock += 100
        out.kernels.append(DeviceEvent(f"kernel<{op.name.split('::')[-1]}>", clock, clock + duration, correlation, linked))
        clock += duration
    return out


if __name__ == "__main__":
    records = cuda_style(cpu_records(llama_tiny()))
    records.save(HERE / "cuda_profile_llama_tiny_bf16.json")
    print(f"{len(records.ops)} ops, {len(records.launches)} launches, {len(records.kernels)} kernels")
