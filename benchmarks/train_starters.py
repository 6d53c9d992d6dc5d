"""Training: each Triton starter's forward and backward against eager autograd, torch.compile of
it (the joint forward+backward graph) and Liger Kernel where installed, with peak memory.

    python benchmarks/train_starters.py [--dtype bfloat16] [--types rmsnorm cross_entropy] [--dry-run]

Per starter that has a backward_fn, at its type's GPU bench shape (the registry's bench_shape):
- its gradients are first compared with eager autograd's at the same inputs and upstream gradient
  (a wrong one is reported WRONG and not timed);
- forward, backward and forward+backward are timed (triton.testing.do_bench on a GPU: L2 flushed,
  median), and so are eager autograd, torch.compile of the eager op and, where Liger Kernel is
  installed and has the op, Liger's;
- the peak memory of one forward+backward beyond the inputs (torch.cuda.max_memory_allocated).
Every row is printed as soon as it is measured. --dry-run runs the same code on the CPU under the
Triton interpreter at the CPU timing shape in float32, without torch.compile: it proves the script
end to end; its timings are the interpreter's and mean nothing for a GPU, and memory is not measured.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

TYPES = ("rmsnorm", "layernorm", "softmax", "cross_entropy", "rotary_embedding", "reduce", "matmul",
         "fused_mlp", "flash_attention")
# chains: the fused starter against its operators in eager, torch.compile of them, and Liger's fused op
CHAINS = ("add_rmsnorm", "silu_mul", "rotary_qk", "linear_cross_entropy")


def _liger_chains(liger) -> dict:
    """Liger's fused ops for the chain types, adapted to the chain's kernel_fn signature and output,
    where this Liger version has them (looked up by name: releases add and rename them)."""
    import torch
    found = {}
    if hasattr(liger, "liger_swiglu"):
        found["silu_mul"] = lambda gate, up: liger.liger_swiglu(gate, up)
    if hasattr(liger, "liger_rope"):
        # Liger takes cos and sin [B, S, D] and returns q and k rotated; the chain's output is their cat
        found["rotary_qk"] = lambda q, k, cos, sin: torch.cat(liger.liger_rope(q, k, cos[None], sin[None]), dim=1)
    if hasattr(liger, "liger_fused_linear_cross_entropy"):
        found["linear_cross_entropy"] = (lambda x, w, t, ignore_index=-100, reduction="mean":
                                         liger.liger_fused_linear_cross_entropy(x, w, t, ignore_index=ignore_index,
                                                                                reduction=reduction))
    if hasattr(liger, "liger_fused_add_rms_norm"):
        found["add_rmsnorm"] = lambda x, r, w, eps=1e-6: torch.stack(liger.liger_fused_add_rms_norm(x, r, w, eps)[::-1])
    return found


def _liger(kernel_type: str):
    """Liger's autograd op for the type, as a function of the type's arguments, or a reason."""
    try:
        from liger_kernel.transformers import functional as liger
    except ImportError:
        return None, "Liger Kernel not installed"
    ops = {"rmsnorm": lambda x, w, eps=1e-6: liger.liger_rms_norm(x, w, eps=eps),
           "layernorm": lambda x, w, b, eps=1e-5: liger.liger_layer_norm(x, w, b, eps),
           "cross_entropy": lambda logits, targets: liger.liger_cross_entropy(logits, targets),
           **_liger_chains(liger)}
    return ops.get(kernel_type), (None if kernel_type in ops else "no Liger op for this type")


def _timer(device: str):
    if device == "cuda":
        from triton.testing import do_bench
        return lambda fn: do_bench(fn, return_mode="median") * 1e3
    def cpu(fn, reps=3):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2] * 1e6
    return cpu


def _peak_bytes(fn, device: str):
    import torch
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _inputs(kernel_type: str, dtype: str, device: str, dry: bool):
    import torch
    from harness.kernel_types import registry
    kt = registry.get(kernel_type)
    case = registry.Case.make(kernel_type, kt.cpu_bench_shape if dry else kt.bench_shape, dtype)
    args, kwargs = kt.make_inputs(case, torch.Generator().manual_seed(0))
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    grads = tuple(kt.params.index(p) for p in kt.grad_params)
    return kt, args, kwargs, grads


def measure(kernel_type: str, dtype: str, device: str, dry: bool, compile_: bool) -> str:
    import importlib

    import torch
    starter = importlib.import_module(f"starter_kernels.triton.{kernel_type}")
    if not hasattr(starter, "backward_fn"):
        return f"{kernel_type}: the starter has no backward"
    kt, args, kwargs, grads = _inputs(kernel_type, dtype, device, dry)
    out = starter.kernel_fn(*args, **kwargs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=out.dtype)

    def autograd_fn(op):
        leaves = [a.detach().requires_grad_(i in grads) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
        def step():
            y = op(*leaves, **kwargs)
            torch.autograd.backward(y, g)
            return [leaves[i].grad for i in grads]
        return step

    eager = autograd_fn(kt.eager)
    want = eager()
    got = starter.backward_fn(g, out, *args, **kwargs)
    for name, a, b in zip((kt.params[i] for i in grads), got, want):
        scale = b.float().pow(2).mean().sqrt().item() or 1.0
        err = (a.float() - b.float()).abs().max().item() / scale
        if not err < (0.1 if dtype != "float32" else 1e-3):
            return f"{kernel_type} {dtype}: WRONG d{name} (max error {err:.3g} of the eager gradient's rms)"
    timer = _timer(device)
    rows = {"starter": (lambda: starter.kernel_fn(*args, **kwargs), lambda: starter.backward_fn(g, out, *args, **kwargs),
                        lambda: starter.backward_fn(g, starter.kernel_fn(*args, **kwargs), *args, **kwargs)),
            "eager": (None, None, eager)}
    if compile_:
        rows["torch.compile"] = (None, None, autograd_fn(torch.compile(kt.eager)))
    liger, why = _liger(kernel_type)
    if liger is not None:
        rows["liger"] = (None, None, autograd_fn(liger))
    parts = []
    for name, (fwd, bwd, both) in rows.items():
        both()  # warm: compiles, autotunes
        times = [f"fwd {timer(fwd):.1f} us, bwd {timer(bwd):.1f} us, " if fwd else "", f"fwd+bwd {timer(both):.1f} us"]
        peak = _peak_bytes(both, device)
        parts.append(f"{name} {''.join(times)}" + (f", peak {peak / 2**20:.1f} MiB" if peak is not None else ""))
    label = "x".join(str(v) for v in (kt.cpu_bench_shape if dry else kt.bench_shape).values())
    note = "" if device == "cuda" else " [CPU interpreter: timings mean nothing for a GPU; memory not measured]"
    return f"{kernel_type}[{label}:{dtype}] " + "; ".join(parts) + (f"; liger: {why}" if why else "") + note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--types", nargs="+", default=list(TYPES), help=f"kernel types; the chains: {' '.join(CHAINS)}")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ns = ap.parse_args(argv)
    if ns.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch
    device = "cpu" if ns.dry_run or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not ns.dry_run:
        print("no CUDA device: use --dry-run to prove the script on the CPU", file=sys.stderr)
        return 2
    dtype = "float32" if ns.dry_run else ns.dtype
    failed = 0
    for kernel_type in ns.types:
        try:
            line = measure(kernel_type, dtype, device, ns.dry_run, compile_=not (ns.dry_run or ns.no_compile))
        except Exception as e:  # noqa: BLE001 - one starter's failure is a row, not the end of the check
            line = f"{kernel_type} {dtype}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        failed += "WRONG" in line or "FAILED" in line
        print(line, flush=True)
    print(f"{failed} starter(s) wrong or failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
