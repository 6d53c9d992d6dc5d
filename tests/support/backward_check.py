"""A starter's backward_fn against float64 autograd of its type's reference, outside the judge.

For one case: the forward runs (kernel_fn), the case's upstream gradient is drawn, backward_fn(grad_out,
out, *inputs) runs, and every gradient it returns is compared with float64 autograd of the type's
reference at the same inputs under the same grad_out. The rules are the judge's own, imported, never
copied: which parameters are differentiable and which are summed over rows (the registry), the
upstream gradient, the reference gradients, the bound per element and its tolerances per dtype
(harness/kernel_types/gradients.py) and the comparison (harness/correctness/compare.py), so a
tolerance loosened in the judge shows here and the "checker can fail" tests fail with it. Also
checked: one gradient per differentiable parameter, each shaped and typed like its input, none
aliasing an input, `out` or grad_out, and grad_out left as it came.

Run as a script it prints the worst error per (starter, dtype):
`TRITON_INTERPRET=1 PYTHONPATH=.:tests/support python tests/support/backward_check.py [TYPE ...]`.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

import torch

from harness.correctness import interpreter_speed
from harness.correctness.compare import check_values
from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case

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
    # chains
    "add_rmsnorm": [(d, {}) for d in ROWS] + [({"M": 6, "N": 200}, {"eps": 1e-2})],
    "silu_mul": [(d, {}) for d in ROWS],
    "rotary_qk": [({"B": 2, "HQ": 4, "HK": 2, "S": 37, "D": 64}, {}), ({"B": 1, "HQ": 2, "HK": 1, "S": 5, "D": 34}, {})],
    "linear_cross_entropy": [({"N": 13, "D": 40, "V": 1000}, {}), ({"N": 37, "D": 24, "V": 70}, {"reduction": "sum"}),
                             ({"N": 9, "D": 16, "V": 300}, {"ignore_index": 0})],
}
VARIANTS = {"rmsnorm": ["noncontig"], "layernorm": ["offset"], "softmax": ["noncontig"],
            "matmul": ["transposed"], "flash_attention": ["noncontig"], "add_rmsnorm": ["offset"],
            "silu_mul": ["noncontig"], "rotary_qk": ["noncontig"], "linear_cross_entropy": ["model_views"]}


@dataclass
class Checked:
    label: str
    dtype: str
    errors: dict[str, float]  # gradient name -> max |got - ref| / (atol * scale + rtol * |ref|)
    relative: dict[str, float]  # gradient name -> max |got - ref| / scale
    failures: list[str]


def grad_params(kernel_type: str) -> tuple[str, ...]:
    return registry.get(kernel_type).grad_params


def summed_grads(kernel_type: str) -> tuple[str, ...]:
    return registry.get(kernel_type).summed_grads


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
    """The judge's float64 autograd of `kernel_type`'s reference at these inputs under `grad_out`."""
    case = Case.make(kernel_type, {}, registry.DTYPE_NAMES.get(args[0].dtype, "float32"), seed=0)
    return gradients.reference_grads(case, (args, kwargs), grad_out)


def _aliases(t: torch.Tensor, others: list) -> bool:
    return any(isinstance(o, torch.Tensor) and o.numel() and t.numel()
               and o.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for o in others)


def check_case(module, case: Case) -> Checked:
    # the interpreter without the work whose result it drops, as every judged process runs it: the
    # same bits (tests/harness/correctness/test_interpreter_speed.py), in a fraction of the time
    interpreter_speed.install()
    kt = registry.get(case.kernel_type)
    args, kwargs = registry.build_inputs(case)
    if case.kernel_type == "cross_entropy":  # an ignored row must get no gradient
        args[1][1] = -100
    out = module.kernel_fn(*args, **kwargs)
    grad_out = gradients.upstream(case, args, kwargs)
    before = grad_out.clone()
    grads = module.backward_fn(grad_out, out, *args, **kwargs)
    names = grad_params(case.kernel_type)
    failures = []
    if not isinstance(grads, tuple) or len(grads) != len(names):
        return Checked(case.label(), case.dtype, {}, {}, [f"expected a tuple of {len(names)} gradients"])
    if not torch.equal(grad_out, before):
        failures.append("grad_out was written")
    refs = gradients.reference_grads(case, (args, kwargs), grad_out)
    sizes = gradients.magnitudes(case, (args, kwargs), grad_out)
    inputs = dict(zip(kt.params, args))
    errors, relative = {}, {}
    for name, got, ref, size in zip(names, grads, refs, sizes):
        want = inputs[name]
        if got.shape != want.shape or got.dtype != want.dtype:
            failures.append(f"d{name}: {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}")
            continue
        if _aliases(got, [*args, out, grad_out]):
            failures.append(f"d{name} shares memory with an input, out or grad_out")
        got64 = got.detach().double()
        cmp = check_values(got64, ref, gradients.bound(case, name, ref, got.dtype, size), got.dtype)
        scale = gradients.error_scale(case, name, ref).clamp_min(1e-30)
        diff = (got64 - ref).abs()
        errors[name] = cmp.worst_ratio if cmp.ok or cmp.worst_ratio > 1.0 else float("inf")  # NaN/Inf misplaced
        relative[name] = float((diff / scale).nan_to_num(float("inf")).max()) if diff.numel() else 0.0
        if not cmp.ok:
            failures.append(f"d{name}: {cmp.detail} (max |err| / scale {relative[name]:.3g})")
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
