"""Registers, spills and shared memory of the Triton starters on GPU targets, per configuration.

    python benchmarks/starter_resources.py [--arch sm_90 sm_80] [--sample 6] [--dtype float16]
                                           [--types matmul fused_mlp ...]

For each starter: its default CONFIG and a sample of the other configurations its CONSTRAINTS
allow, each launched once at the GPU bench shape with launches recorded but not run (no GPU and
no interpreter needed), then compiled ahead of time for every architecture through the judge's own
compile-for-target path (harness/compiling/target_compile.py). A starter with a backward_fn is
recorded twice: its forward, then its backward (called on the recorded forward's output and a
grad_out shaped like it). One row per (starter, pass, config, arch) with the worst kernel's figures; a row whose kernel would not launch there (shared memory over the limit,
too many registers per block) or does not compile is marked so. Exit status 1 when any row spills
or would not launch.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import random
import sys

import torch

from autokernel.search.kernel_source import check_constraints
from harness.kernel_types import registry
from harness.correctness import launches
from harness.correctness.launches import LaunchMonitor
from harness.kernel_types.registry import Case
from harness.compiling.target_compile import _launch_problem, compile_triton, parse_arch
from starter_kernels import KERNEL_TYPES

GPU_PROGRAMS = 132  # H100 / H200 multiprocessors: matmul's tile-filling rule sees a GPU's count


def allowed_configs(module, sample: int, seed: int = 0, tries: int = 20000) -> list[dict]:
    """The default CONFIG first, then up to `sample` other configurations the CONSTRAINTS allow,
    drawn at random (a forward's and a backward's tunables together span far too many to list)."""
    rng, found = random.Random(seed), [dict(module.CONFIG)]
    for _ in range(tries if sample else 0):
        config = {name: rng.choice(values) for name, values in module.TUNABLES.items()}
        if config not in found and check_constraints(module.CONSTRAINTS, config):
            found.append(config)
            if len(found) > sample:
                break
    return found


def bench_inputs(kernel_type: str, dtype: str) -> tuple[list, dict]:
    """The kernel type's inputs at its bench shape (seed 0)."""
    kt = registry.get(kernel_type)
    return kt.make_inputs(Case.make(kt.name, kt.bench_shape, dtype), torch.Generator().manual_seed(0))


def recorded_launches(module, config: dict, dtype: str, arch: str, backward: bool = False,
                      inputs: tuple[list, dict] | None = None) -> list:
    """The launches kernel_fn (or, with `backward`, backward_fn) makes at the bench shape under
    `config` on a GPU of `arch`, recorded and not run (a starter that picks a variant by GPU
    generation is told the target's). `inputs`: bench_inputs, made once by a caller recording
    several (at a bench shape, making them costs far more than recording: nothing runs, so
    nothing writes them)."""
    from triton.runtime.jit import JITFunction
    if hasattr(module, "_tma_device"):
        module._tma_device = lambda device: parse_arch(arch) >= 90
    args, kwargs = inputs or bench_inputs(module.KERNEL_TYPE, dtype)
    from triton.runtime.interpreter import InterpretedFunction
    saved_config = dict(module.CONFIG)
    saved_runs = [(cls, cls.run) for cls in (JITFunction, InterpretedFunction)]
    for cls, _ in saved_runs:  # record only: nothing runs, compiled or interpreted
        cls.run = lambda *a, **k: None
    try:
        module.CONFIG.clear()
        module.CONFIG.update(config)
        monitor = LaunchMonitor()
        monitor.recording = True
        for cls, _ in saved_runs:  # a monitor of its own over the no-op runs, put back below
            launches._wrap_run(monitor, cls)
        if not backward:
            module.kernel_fn(*args, **kwargs)
            return monitor.take_records()
        out = module.kernel_fn(*args, **kwargs)  # allocated, never computed: only its shape counts
        monitor.take_records()  # the forward's launches: only the backward's are wanted here
        module.backward_fn(torch.empty_like(out), out, *args, **kwargs)
        return monitor.take_records()
    finally:
        for cls, run in saved_runs:
            cls.run = run
        module.CONFIG.clear()
        module.CONFIG.update(saved_config)


def resource_rows(kernel_type: str, archs: list[str], sample: int, dtype: str) -> list[dict]:
    module = importlib.import_module(f"starter_kernels.triton.{kernel_type}")
    if hasattr(module, "CPU_PROGRAMS"):
        module.CPU_PROGRAMS = GPU_PROGRAMS
    rows = []
    passes = ["forward", "backward"] if hasattr(module, "backward_fn") else ["forward"]
    inputs = bench_inputs(module.KERNEL_TYPE, dtype)
    for config, arch, which in itertools.product(allowed_configs(module, sample), archs, passes):
        records = recorded_launches(module, config, dtype, arch, backward=which == "backward", inputs=inputs)
        result = compile_triton(records, arch)
        row = {"starter": kernel_type, "pass": which, "config": config, "arch": arch, "ok": result.ok,
               "problem": "" if result.ok else result.detail.splitlines()[0][:160]}
        if result.kernels:
            row.update(registers=max(k.registers for k in result.kernels),
                       spills=max(k.spills for k in result.kernels),
                       shared_bytes=max(k.shared_bytes for k in result.kernels))
            problems = [p for k in result.kernels if (p := _launch_problem(k, parse_arch(arch)))]
            row["problem"] = row["problem"] or "; ".join(problems)[:160]
        rows.append(row)
    return rows


def _config_text(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["sm_90", "sm_80"])
    parser.add_argument("--sample", type=int, default=4, help="other allowed configs per starter")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--types", nargs="+", default=list(KERNEL_TYPES))
    args = parser.parse_args(argv)
    bad = 0
    print(f"{'starter':17} {'pass':8} {'arch':6} {'regs':>5} {'spills':>6} {'smem B':>7}  config  [problem]")
    for kernel_type in args.types:
        for row in resource_rows(kernel_type, args.arch, args.sample, args.dtype):
            spills = row.get("spills")
            bad += bool(spills) or bool(row["problem"])
            print(f"{row['starter']:17} {row['pass']:8} {row['arch']:6} {row.get('registers', '-'):>5} {spills if spills is not None else '-':>6} "
                  f"{row.get('shared_bytes', '-'):>7}  {_config_text(row['config'])}"
                  + (f"  [{row['problem']}]" if row["problem"] else ""), flush=True)
    print(f"{bad} row(s) spill or would not launch")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
