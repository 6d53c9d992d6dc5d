"""Every Triton starter's backward_fn against float64 autograd of its type's reference, under a
random upstream gradient, at odd shapes, over several programs (weight gradients summed across
them), in fp32, fp16 and (where the interpreter can: no tl.dot) bf16. The checker itself
(tests/support/backward_check.py) is shown to refuse wrong backwards."""
from __future__ import annotations

import ast

import pytest
import torch

import backward_check
from autokernel.search.kernel_source import check_constraints
from starter_configs import TRITON as SECOND_CONFIGS

from starter_kernels import KERNEL_TYPES, starter_path
from harness.isolation.static_check import check_file


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_starter_backward_matches_float64_autograd(kernel_type):
    rows = backward_check.check(kernel_type)
    failures = [f"{row.label}: {f}" for row in rows for f in row.failures]
    assert failures == [], "\n".join(failures)
    assert {row.dtype for row in rows} == set(backward_check.dtypes(kernel_type))
    # every differentiable parameter compared in every case
    assert all(set(row.errors) == set(backward_check.grad_params(kernel_type)) for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_second_backward_config_matches_float64_autograd(kernel_type, monkeypatch):
    # smaller BWD_ blocks: rows longer than a block take the chunked loops, more programs share a
    # weight gradient, attention's key blocks are wider than its query blocks
    module = backward_check.starter(kernel_type)
    config = SECOND_CONFIGS[kernel_type]
    assert check_constraints(module.CONSTRAINTS, config)
    monkeypatch.setattr(module, "CONFIG", {**module.CONFIG, **config})
    rows = [backward_check.check_case(module, case) for case in backward_check.cases(kernel_type)[:2]]
    failures = [f"{row.label}: {f}" for row in rows for f in row.failures]
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_starter_backward_passes_the_static_check(kernel_type):
    assert check_file(starter_path(kernel_type)) == []


@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_backward_tunables_are_prefixed_and_declared(kernel_type):
    # the tuner searches a backward's parameters as it searches the forward's: in the one TUNABLES
    tree = ast.parse(starter_path(kernel_type).read_text(encoding="utf-8"))
    literals = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id in ("TUNABLES", "CONFIG")}
    backward = {k for k in literals["CONFIG"] if k.startswith("BWD_")}
    assert backward, "the backward has no tunable parameter"
    assert backward <= set(literals["TUNABLES"])
    assert all(literals["CONFIG"][k] in literals["TUNABLES"][k] for k in backward)


# ------------------------------------------------------------------ the checker can fail
class _Wrong:
    """A starter whose backward is altered after the fact."""

    def __init__(self, module, alter):
        self.kernel_fn = module.kernel_fn
        self._backward, self._alter = module.backward_fn, alter

    def backward_fn(self, *args, **kwargs):
        return self._alter(self._backward(*args, **kwargs))


def _first_failures(kernel_type: str, alter) -> list[str]:
    module = _Wrong(backward_check.starter(kernel_type), alter)
    case = backward_check.cases(kernel_type)[0]
    return backward_check.check_case(module, case).failures


@pytest.mark.parametrize("dtype, factor", [("float32", 1.01), ("float16", 1.03), ("bfloat16", 1.1)])
def test_checker_refuses_a_gradient_off_by_a_factor(dtype, factor):
    # a few times each dtype's tolerance (the judge's own: backward_check imports them), so a
    # tolerance loosened in the judge lets it through and this fails
    module = _Wrong(backward_check.starter("rmsnorm"), lambda g: (g[0] * factor, g[1]))
    case = next(c for c in backward_check.cases("rmsnorm") if c.dtype == dtype)
    failures = backward_check.check_case(module, case).failures
    assert any(f.startswith("dx:") for f in failures), failures
    assert backward_check.check_case(backward_check.starter("rmsnorm"), case).failures == []


def test_checker_refuses_a_weight_gradient_of_the_first_program_only():
    def first_block(g):
        dw = g[1] * 0
        dw[:64] = g[1][:64]
        return g[0], dw
    assert any(f.startswith("dweight:") for f in _first_failures("rmsnorm", first_block))


def test_checker_refuses_a_missing_gradient_and_a_wrong_dtype():
    assert _first_failures("rmsnorm", lambda g: (g[0],)) == ["expected a tuple of 2 gradients"]
    failures = _first_failures("layernorm", lambda g: (g[0], g[1].double(), g[2]))
    assert any("dweight:" in f and "float64" in f for f in failures), failures


def test_checker_refuses_a_gradient_that_aliases_its_input():
    failures = _first_failures("rotary_embedding", lambda g: (g[0].view(g[0].shape),))
    assert failures == [], failures  # a view of a fresh gradient is its own memory
    module = backward_check.starter("softmax")

    class Aliasing:
        kernel_fn = staticmethod(module.kernel_fn)

        @staticmethod
        def backward_fn(grad_out, out, x):
            return (x,)  # wrong, and the input's own memory handed back as its gradient
    failures = backward_check.check_case(Aliasing, backward_check.cases("softmax")[0]).failures
    assert any("shares memory" in f for f in failures), failures


def test_checker_compares_against_autograd_not_against_itself():
    # the reference gradient of rmsnorm's dweight at a known point: sum over rows of g * x * r
    x = torch.tensor([[3.0, 4.0]])
    g = torch.tensor([[1.0, 1.0]])
    ref = backward_check.reference_grads("rmsnorm", [x, torch.ones(2)], {"eps": 0.0}, g)
    r = 1 / (12.5 ** 0.5)
    assert torch.allclose(ref[1], torch.tensor([3 * r, 4 * r], dtype=torch.float64))
