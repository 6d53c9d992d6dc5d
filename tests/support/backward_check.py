"""A starter's backward_fn against float64 autograd of its type's reference, outside the judge.

For one case: the forward runs (kernel_fn), a random upstream gradient shaped like its output is
drawn, backward_fn(grad_out, out, *inputs) runs, and every gradient it returns is compared with
autograd of the type's float64 `reference` at the same inputs under the same grad_out. The bound
per element is |got - ref| <= atol * scale + rtol * |ref|: scale is the rms of the reference
gradient's row for a gradient shaped like an activation, and the rms of the whole gradient for a
weight gradient summed over rows (its elements are sums of M terms; one near zero by cancellation
is held to what its neighbours' size allows). Also checked: one gradient per differentiable
parameter, each shaped and typed like its input, none aliasing an input, `out` or grad_out, and
grad_out left as it came.

Run as a script it prints the worst error per (starter, dtype):
`TRITON_INTERPRET=1 PYTHONPATH=.:tests/support python tests/support/backward_check.py [TYPE ...]`.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import torch

from harness.kernel_types import registry
from harness.kernel_types.registry import Case

# Differentiable parameters, and of those the ones summed over rows of the output (per type, the
# training contract). Attention's three are all such sums: a row of dq sums over keys, of dk and dv
# over queries, and a causal query 0's dq is exactly zero, its computed value the rounding of
# p * (dp - delta) with p = 1: measured against its own row's rms (zero) even PyTorch's eager
# backward fails by 1e23, so they are held to the whole gradient's rms.
GRAD_PARAMS = {"matmul": ("a", "b"), "softmax": ("x",), "layernorm": ("x", "weight", "bias"),
               "rmsnorm": ("x", "weight"), "flash_attention": ("q", "k", "v"),
               "fused_mlp": ("x", "w_gate", "w_up", "w_down"), "cross_entropy": ("logits",),
               "rotary_embedding": ("x",), "reduce": ("x",)}
SUMMED_GRADS = {"matmul": ("b",), "layernorm": ("weight", "bias"), "rmsnorm": ("weight",),
                "fused_mlp": ("w_gate", "w_up", "w_down"), "flash_attention": ("q", "k", "v")}
# (rtol, atol) per gradient dtype: a backward reads the forward's rounded output and recomputes a
# row's statistics, so fp32 gets twice the forward's budget; fp16 and bf16 gradients are rounded
# once on store on top of inputs and an upstream gradient already in that dtype.
GRAD_TOLERANCES = {"float32": (2e-4, 2e-4), "float16": (5e-3, 5e-3), "bfloat16": (2e-2, 2e-2)}
UPSTREAM_SEED = 7_000_003

ROWS = [{"M": 37, "N": 200}, {"M": 3, "N": 4097}, {"B": 2, "S": 3, "N": 96}, {"M": 130, "N": 33}]
# (dims, kwargs) per type: non-powers of two, more rows than programs (weight gradients summed
# across programs), a row longer than the default block (the multi-block path)
CASES = {
    "rmsnorm": [(d, {}) for d in ROWS] + [({"M": 6, "N": 200}, {"eps": 1e-2})],
    "layernorm": [(d, {}) for d in ROWS] + [({"M": 6, "N": 200}, {"eps": 1e-2})],
    "softmax": [(d, {}) for d in ROWS],
    "reduce": [(d, {}) for d in ROWS],
    "cross_entropy": [({"N": 13, "V": 1000}, {}), ({"N": 3, "V": 5000}, {}), ({"N": 130, "V": 33}, {})],
    "rotary_embedding": [({"B": 2, "H": 3, "S": 37, "D": 64}, {}), ({"B": 1, "H": 2, "S": 5, "D": 34}, {})],
    "matmul": [({"M": 37, "K": 45, "N": 50}, {}), ({"M": 64, "K": 33, "N": 17}, {}), ({"M": 1, "K": 16, "N": 20}, {})],
    "fused_mlp": [({"M": 19, "D": 40, "F": 72}, {}), ({"M": 33, "D": 64, "F": 96}, {})],
    "flash_attention": [({"B": 1, "H": 2, "S": 37, "D": 32}, {}),
                        ({"B": 1, "H": 2, "S": 37, "D": 32}, {"causal": True}),
                        ({"B": 2, "H": 1, "S": 70, "D": 64}, {"causal": True, "sm_scale": 0.3})],
}
VARIANTS = {"rmsnorm": ["noncontig"], "layernorm": ["offset"], "softmax": ["noncontig"],
            "matmul": ["transposed"], "flash_attention": ["noncontig"]}


@dataclass
class Checked:
    label: str
    dtype: str
    errors: dict[str, float]  # gradient name -> max |got - ref| / (atol * scale + rtol * |ref|)
    relative: dict[str, float]  # gradient name -> max |got - ref| / scale
    failures: list[str]


def grad_params(kernel_type: str) -> tuple[str, ...]:
    return GRAD_PARAMS[kernel_type]


def summed_grads(kernel_type: str) -> tuple[str, ...]:
    return SUMMED_GRADS.get(kernel_type, ())


def dtypes(kernel_type: str) -> list[str]:
    # the interpreter multiplies bf16 tiles wrongly: bf16 only where there is no tl.dot
    return ["float32", "float16"] + ([] if registry.get(kernel_type).dot_products else ["bfloat16"])


def cases(kernel_type: str) -> list[Case]:
    found = [Case.make(kernel_type, dims, dtype, seed=i, **kwargs)
             for dtype in dtypes(kernel_type) for i, (dims, kwargs) in enumerate(CASES[kernel_type])]
    dims, kwargs = CASES[kernel_type][0]
    found += [Case.make(kernel_type, dims, "float32", seed=99, variant=v, **kwargs)
              for v in VARIANTS.get(kernel_type, [])]
    return found


def reference_grads(kernel_type: str, args: list, kwargs: dict, grad_out: torch.Tensor) -> list[torch.Tensor]:
    kt = registry.get(kernel_type)
    wanted = grad_params(kernel_type)
    call, leaves = [], []
    for name, a in zip(kt.params, args):
        if name in wanted:
            leaves.append(a.detach().double().requires_grad_(True))
            call.append(leaves[-1])
        else:
            call.append(a)
    with torch.enable_grad():
        out = kt.reference(*call, **kwargs)
        return list(torch.autograd.grad(out, leaves, grad_out.double()))


def _scale(ref: torch.Tensor, summed: bool) -> torch.Tensor:
    if summed:
        return ref.pow(2).mean().sqrt().expand_as(ref)
    return registry.row_rms(ref)


def _aliases(t: torch.Tensor, others: list) -> bool:
    return any(isinstance(o, torch.Tensor) and o.numel() and t.numel()
               and o.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for o in others)


def check_case(module, case: Case) -> Checked:
    kt = registry.get(case.kernel_type)
    args, kwargs = registry.build_inputs(case)
    if case.kernel_type == "cross_entropy":  # an ignored row must get no gradient
        args[1][1] = -100
    out = module.kernel_fn(*args, **kwargs)
    gen = torch.Generator().manual_seed(case.seed + UPSTREAM_SEED)
    grad_out = torch.randn(out.shape, generator=gen).to(out.dtype)
    before = grad_out.clone()
    grads = module.backward_fn(grad_out, out, *args, **kwargs)
    names = grad_params(case.kernel_type)
    failures = []
    if not isinstance(grads, tuple) or len(grads) != len(names):
        return Checked(case.label(), case.dtype, {}, {}, [f"expected a tuple of {len(names)} gradients"])
    if not torch.equal(grad_out, before):
        failures.append("grad_out was written")
    refs = reference_grads(case.kernel_type, args, kwargs, grad_out)
    inputs = dict(zip(kt.params, args))
    errors, relative = {}, {}
    for name, got, ref in zip(names, grads, refs):
        want = inputs[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            failures.append(f"d{name}: {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")
            continue
        if _aliases(got, [*args, out, grad_out]):
            failures.append(f"d{name} shares memory with an input, out or grad_out")
        rtol, atol = GRAD_TOLERANCES[case.dtype]
        scale = _scale(ref, name in summed_grads(case.kernel_type)).clamp_min(1e-30)
        diff = (got.double() - ref).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
        errors[name] = (diff / (atol * scale + rtol * ref.abs())).max().item() if diff.numel() else 0.0
        relative[name] = (diff / scale).max().item() if diff.numel() else 0.0
        if errors[name] > 1.0:
            failures.append(f"d{name}: error {errors[name]:.3g} x the bound (max |err| / scale {relative[name]:.3g})")
    return Checked(case.label(), case.dtype, errors, relative, failures)


def starter(kernel_type: str):
    return importlib.import_module(f"starter_kernels.triton.{kernel_type}")


def check(kernel_type: str, module=None) -> list[Checked]:
    module = module or starter(kernel_type)
    return [check_case(module, case) for case in cases(kernel_type)]


def main(types: list[str]) -> int:
    bad = 0
    for kernel_type in types:
        worst: dict[str, tuple[float, float]] = {}
        for row in check(kernel_type):
            bad += bool(row.failures)
            for failure in row.failures:
                print(f"FAIL {row.label}: {failure}")
            for name, rel in row.relative.items():
                key = f"{row.dtype} d{name}"
                old = worst.get(key, (0.0, 0.0))
                worst[key] = (max(old[0], rel), max(old[1], row.errors[name]))
        # max |err| / scale, and in brackets the worst element's share of its bound
        print(f"{kernel_type}: " + ", ".join(f"{k} {v:.1e} ({b:.2f})" for k, (v, b) in worst.items()),
              flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(CASES)))
