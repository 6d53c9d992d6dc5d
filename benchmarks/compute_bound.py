"""The compute-bound Triton starters against what a user already has, at the shapes that matter.

    python benchmarks/compute_bound.py [--out FILE] [--dtypes float16 bfloat16] [--dry-run]

- matmul vs cuBLAS (torch.matmul): 4096^3 (goal 0.95x) and the LLaMA-7B projection shapes
  (K, N) in {(4096, 4096), (4096, 11008), (11008, 4096)} at M in {512, 2048, 8192} (goal 0.9x);
- flash_attention vs SDPA: B=4, H=32, S=2048, head dims 64 and 128, causal and not (goal 0.9x);
- fused_mlp vs eager F.linear / silu: M=4096, D=4096, F=11008 (goal 1.1x).

Every row is checked against the baseline's output before it is timed (a wrong kernel is reported
WRONG, not timed), then timed with triton.testing.do_bench (L2 flushed between reps, median), and
printed as soon as it is measured: "met" or "short" against its goal. With --out each row is also
appended to that file.

--dry-run runs the same code on the CPU under the Triton interpreter at tiny shapes, fp16 only
(the interpreter has no bf16 dot): it proves the script end to end, its timings mean nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

GOALS = {"matmul_4096": 0.95, "matmul": 0.9, "flash_attention": 0.9, "fused_mlp": 1.1}
LLAMA_PROJECTIONS = [(4096, 4096), (4096, 11008), (11008, 4096)]  # (K, N): q/k/v/o, gate/up, down


@dataclass
class Row:
    name: str
    goal: float
    make: Callable[[], tuple]  # -> (starter_fn, baseline_fn), both argument-free
    tolerance: float


def _tensors(shapes, dtype, device, scale=None):
    import torch
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for shape in shapes:
        std = scale or 1.0 / max(1.0, shape[-1] ** 0.5)
        out.append((torch.randn(shape, generator=gen) * std).to(device=device, dtype=dtype))
    return out


def rows(dtype_name: str, device: str, dry: bool) -> list[Row]:
    import torch
    import torch.nn.functional as F

    from starter_kernels.triton import flash_attention, fused_mlp, matmul
    dtype = getattr(torch, dtype_name)
    tol = 2e-2 if dtype_name == "bfloat16" else 1e-2
    out = []

    def mm(m, k, n, goal):
        def make():
            a, = _tensors([(m, k)], dtype, device, scale=1.0)
            b, = _tensors([(k, n)], dtype, device)
            return (lambda: matmul.kernel_fn(a, b)), (lambda: torch.matmul(a, b))
        out.append(Row(f"matmul {m}x{k}x{n} {dtype_name} vs cuBLAS", goal, make, tol))

    def attn(b, h, s, d, causal):
        def make():
            q, k, v = _tensors([(b, h, s, d)] * 3, dtype, device, scale=1.0)
            return ((lambda: flash_attention.kernel_fn(q, k, v, causal=causal)),
                    (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
        out.append(Row(f"flash_attention {b}x{h}x{s}x{d} causal={causal} {dtype_name} vs SDPA",
                       GOALS["flash_attention"], make, tol))

    def mlp(m, d, f):
        def make():
            x, = _tensors([(m, d)], dtype, device, scale=1.0)
            wg, wu = _tensors([(f, d), (f, d)], dtype, device)
            wd, = _tensors([(d, f)], dtype, device)
            return ((lambda: fused_mlp.kernel_fn(x, wg, wu, wd)),
                    (lambda: F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)))
        out.append(Row(f"fused_mlp {m}x{d}x{f} {dtype_name} vs eager", GOALS["fused_mlp"], make, tol))

    if dry:  # same code paths, interpreter-sized
        mm(64, 64, 64, GOALS["matmul_4096"])
        mm(32, 64, 96, GOALS["matmul"])
        for causal in (False, True):
            attn(1, 2, 64, 64, causal)
        mlp(32, 64, 96)
        return out
    mm(4096, 4096, 4096, GOALS["matmul_4096"])
    for m in (512, 2048, 8192):
        for k, n in LLAMA_PROJECTIONS:
            mm(m, k, n, GOALS["matmul"])
    for d in (64, 128):
        for causal in (False, True):
            attn(4, 32, 2048, d, causal)
    mlp(4096, 4096, 11008)
    return out


def _time_us(fn, device: str) -> float:
    if device == "cuda":
        import triton.testing
        return 1000.0 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return 1e6 * (time.perf_counter() - start)


def measure(row: Row, device: str) -> str:
    import torch
    try:
        starter, baseline = row.make()
        got, want = starter().float(), baseline().float()
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))
        if not torch.isfinite(got).all() or err > row.tolerance:
            return f"{row.name}: WRONG (max error {err:.2e} of the output's max, tolerance {row.tolerance})"
        ours, theirs = _time_us(starter, device), _time_us(baseline, device)
    except Exception as e:  # one row failing must not lose the others
        return f"{row.name}: ERROR {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    ratio = theirs / ours
    verdict = "met" if ratio >= row.goal else f"short by {100 * (row.goal - ratio) / row.goal:.0f}%"
    return (f"{row.name}: starter {ours:.1f} us, baseline {theirs:.1f} us, {ratio:.3f}x "
            f"(goal {row.goal}x): {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="append each row to this file too")
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        args.dtypes = ["float16"]
    import torch
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    if device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}", flush=True)
    short = failed = 0
    for dtype in args.dtypes:
        for row in rows(dtype, device, args.dry_run):
            line = measure(row, device)
            failed += ": WRONG" in line or ": ERROR" in line
            short += ": short" in line
            print(line, flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
    print(f"{short} row(s) short of their goal, {failed} wrong or failed"
          + (" (dry run: interpreter timings, the goals do not apply)" if args.dry_run else ""), flush=True)
    return 1 if failed or (short and not args.dry_run) else 0


if __name__ == "__main__":
    sys.exit(main())
