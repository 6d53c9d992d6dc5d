"""Guard bytes around every buffer of a checked call (harness/correctness/guards.py) and inputs as a
model passes them (harness/correctness/as_passed.py), in this process with the Triton interpreter:
a kernel gets exactly the tensors it would have got (metadata, alignment), a write anywhere in an
input's buffer or past what kernel_fn allocated is found and placed, and the judging process's own
rebuild of the buffers decides (harness/verdict/memory_checks.py)."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import as_passed, guards, launches
from harness.correctness.candidate import observed_call
from harness.kernel_types import registry
from harness.kernel_types.registry import Case
from harness.verdict import memory_checks

VIEWS = Case.make("softmax", {"M": 6, "N": 100}, "float32", seed=17, variant="model_views")


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n, x_stride, y_stride, SPARE: tl.constexpr, PAST_OUT: tl.constexpr,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n, other=float("-inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * y_stride + cols, e / tl.sum(e, 0), mask=cols < n)
    if SPARE:  # one element past the row, in the input's buffer
        tl.store(x_ptr + row * x_stride + n, tl.max(x, 0))
    if PAST_OUT:  # one past the row: the next row's first element (written again), past the end for the last
        tl.store(y_ptr + row * y_stride + n, tl.max(x, 0))


def _kernel(spare: bool = False, past_out: bool = False):
    def kernel_fn(x):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _softmax_rows[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0), SPARE=spare, PAST_OUT=past_out,
                                     BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
    return kernel_fn


def _call(fn, case: Case = VIEWS, mode: str | None = None):
    mode = mode or as_passed.mode_for(case.seed)
    args, kwargs = registry.build_inputs(case, "cpu")
    kt = registry.get(case.kernel_type)
    placed = guards.place(args, case.seed, list(kt.params[:len(args)]),
                          as_passed.inference_positions(kt.name, kt.params, mode))
    passed = as_passed.wrap(placed.args, kt.name, kt.params, mode)
    return observed_call(fn, passed, kwargs, launches.install(), placed, mode)


def test_a_placed_input_keeps_its_metadata_alignment_and_values_inside_a_guarded_buffer():
    args, _ = registry.build_inputs(VIEWS, "cpu")
    placed = guards.place(args, VIEWS.seed, ["x"])
    x, p = args[0], placed.args[0]
    assert (p.shape, p.stride(), p.storage_offset()) == (x.shape, x.stride(), x.storage_offset())
    assert p.untyped_storage().nbytes() == x.untyped_storage().nbytes()
    assert torch.equal(p, x) and p.data_ptr() % 64 == 0
    big = placed.buffers[0]
    assert big.numel() == x.untyped_storage().nbytes() + 2 * guards.GUARD_BYTES
    assert p.untyped_storage().data_ptr() == big.data_ptr() + guards.GUARD_BYTES
    # the judging process rebuilds the same buffer, guards included, from the case's seed
    assert placed.digests() == guards.expected_digests(registry.build_inputs(VIEWS, "cpu")[0], VIEWS.seed, ["x"])


def test_inputs_sharing_a_storage_share_one_guarded_buffer():
    qkv = torch.randn(4, 30)
    qkv[0, 10] = 1.2345678  # k's first element: no byte in common with 5.0's, so all 4 bytes change
    placed = guards.place([qkv[:, :10], qkv[:, 10:20]], 1, ["q", "k"])
    assert len(placed.buffers) == 1 and placed.owner == [0, 0]
    snap = placed.snapshot()
    placed.args[1][0, 0] = 5.0  # q's row 0 one past its end is k's first element
    assert placed.writes(snap) == [{"input": 1, "name": "k", "inside": 4, "outside": 0, "first": None}]


def test_an_honest_kernel_changes_nothing_and_its_output_leaves_the_guards_alone():
    result = _call(_kernel())
    assert result.error is None and result.writes == [] and result.strays == [] and result.mutated == []
    args, _ = registry.build_inputs(VIEWS, "cpu")
    assert result.digests == memory_checks.expected(VIEWS, args)
    ref = registry.reference_output(VIEWS)
    assert (result.output.double() - ref).abs().max() < 1e-6


def test_a_store_past_a_row_of_a_view_is_found_with_its_tensor_and_offset():
    result = _call(_kernel(spare=True))
    (write,) = result.writes
    assert write["name"] == "x" and write["inside"] == 0 and write["outside"] == 6 * 4
    assert write["first"] == {"offset": 100 * 4, "where": "in its storage outside its elements (the wider buffer it "
                                                         "is a view of)"}
    rec = {"passed_as": as_passed.mode_for(VIEWS.seed), "obs": result.observations()}
    problem = memory_checks.call_problem(rec, VIEWS, registry.build_inputs(VIEWS, "cpu")[0])
    assert problem.startswith("softmax[6x100:float32,model_views]: kernel_fn wrote outside the elements of its input x")


def test_a_store_past_the_output_kernel_fn_allocated_lands_in_a_guard_and_is_named(monkeypatch):
    # the guard bytes are drawn from the OS once per process; here every one differs from the byte the
    # kernel stores over it (the last row's maximum, as float32), so all 4 bytes it writes are counted
    stored = registry.build_inputs(VIEWS, "cpu")[0][0][-1].max().reshape(1).view(torch.uint8)
    pattern = torch.full((2 * guards.GUARD_BYTES,), 0x5A, dtype=torch.uint8)
    pattern[guards.GUARD_BYTES:guards.GUARD_BYTES + 4] = stored ^ 0xFF
    monkeypatch.setattr(guards, "_PATTERN", [pattern])
    result = _call(_kernel(past_out=True))
    (stray,) = result.strays
    assert stray["tensor"].startswith("the output (a float32 [6, 100] tensor") and stray["where"] == "past the end"
    assert stray["offset"] == 6 * 100 * 4 and stray["size"] == 6 * 100 * 4 and stray["bytes"] == 4


def test_what_kernel_fn_allocates_keeps_its_metadata():
    allocations = guards.Allocations()
    out = torch.empty_strided((3, 5), (1, 3))
    moved = allocations.adopt("empty_strided", out)
    assert (moved.shape, moved.stride(), moved.storage_offset()) == ((3, 5), (1, 3), 0)
    assert moved.untyped_storage().nbytes() == out.untyped_storage().nbytes() and moved._base is None
    zeros = allocations.adopt("zeros", torch.zeros(7))
    assert torch.equal(zeros, torch.zeros(7))  # the contents an allocation op gave are kept
    assert allocations.adopt("view", out) is out  # a view is not an allocation
    assert allocations.strays(moved) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64,
                                   torch.uint8, torch.bool])
def test_what_torch_empty_returns_holds_a_dead_tensors_values_not_the_oss_zeros(dtype):
    allocations = guards.Allocations()
    big = torch.zeros(1 << 18, dtype=dtype)  # what the CPU gives: zeros, as a fresh mmap is
    moved = allocations.adopt("empty", big)
    assert (moved != 0).all() and moved.dtype == dtype and moved.shape == big.shape
    if dtype.is_floating_point:
        assert moved.isfinite().all() and moved.abs().max() <= 1000
    # what every other allocation op gave is kept: zeros are zeros, a clone is its source
    assert torch.equal(allocations.adopt("zeros", big.clone()), big)
    assert allocations.strays(moved) == []


@triton.jit
def _sum_into(y_ptr, x_ptr, n, BLOCK: tl.constexpr):
    """Adds its row's sum to y[row]: right only where y starts at 0."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    total = tl.sum(tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0), 0)
    tl.store(y_ptr + row, tl.load(y_ptr + row) + total)


def test_a_kernel_that_takes_torch_empty_for_zeros_gets_a_dead_tensors_values():
    def kernel_fn(x):
        # torch.zeros is what it needs; a buffer this large (64 MiB, past glibc's largest mmap
        # threshold) is a fresh mapping of the OS's zeros on the CPU, so the kernel was right here,
        # where a GPU's allocator hands back a dead tensor's values
        scratch = torch.empty(1 << 24, dtype=x.dtype, device=x.device)
        _sum_into[(x.shape[0],)](scratch, x, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return scratch[:x.shape[0]].clone()
    res = _call(kernel_fn, Case.make("reduce", {"M": 6, "N": 100}, "float32", seed=3))
    x = registry.build_inputs(Case.make("reduce", {"M": 6, "N": 100}, "float32", seed=3), "cpu")[0][0]
    assert res.error is None and not torch.allclose(res.output, x.sum(-1), atol=1e-3)


@triton.jit
def _idle(x_ptr):
    tl.program_id(0)


def test_what_a_grid_callable_allocates_is_filled_and_guarded_too():
    """The launch monitor pauses the recorder inside a launch, and Triton calls a grid callable from
    there: the candidate's code all the same, so its allocations are the judge's to fill."""
    def kernel_fn(x):
        out = {}

        def grid(meta):
            scratch = torch.empty(1 << 24, dtype=x.dtype, device=x.device)  # zeros from the OS on the CPU
            _sum_into[(x.shape[0],)](scratch, x, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
            out["y"] = scratch[:x.shape[0]].clone()
            return (1,)
        _idle[grid](x)
        return out["y"]
    case = Case.make("reduce", {"M": 6, "N": 100}, "float32", seed=3)
    res = _call(kernel_fn, case)
    x = registry.build_inputs(case, "cpu")[0][0]
    assert res.error is None and not torch.allclose(res.output, x.sum(-1), atol=1e-3)


@pytest.mark.parametrize("mode", as_passed.MODES)
def test_weights_are_parameters_in_every_mode_and_activations_as_a_model_has_them(mode):
    case = Case.make("rmsnorm", {"M": 4, "N": 32}, "float32", seed=3)
    args, _ = registry.build_inputs(case, "cpu")
    kt = registry.get("rmsnorm")
    placed = guards.place(args, case.seed, ["x", "weight"], as_passed.inference_positions("rmsnorm", kt.params, mode))
    x, weight = as_passed.wrap(placed.args, "rmsnorm", kt.params, mode)
    assert isinstance(weight, torch.nn.Parameter) and weight.requires_grad
    assert weight.data_ptr() == placed.args[1].data_ptr()  # the same storage the guards watch
    assert x.requires_grad == (mode == "grad") and x.is_leaf == (mode != "grad")
    assert x.is_inference() == (mode == "inference") and not weight.is_inference()


@pytest.mark.parametrize("kernel_type", registry.names())
def test_every_verdict_meets_every_mode_in_its_sweep_and_its_layouts(kernel_type):
    from harness.correctness.cases import Capabilities, build_plan
    plan = build_plan(kernel_type, Capabilities("cpu", bf16=False))
    for stage in ("shape_sweep", "edge_cases"):
        assert {as_passed.mode_for(c.seed) for c in plan.stages[stage]} == set(as_passed.MODES), stage


def test_the_judging_process_holds_the_workers_record_to_its_own_rebuild():
    case = Case.make("rmsnorm", {"M": 4, "N": 32}, "float32", seed=3)
    args, _ = registry.build_inputs(case, "cpu")
    want = memory_checks.expected(case, args)
    mode = as_passed.mode_for(case.seed)
    good = {"passed_as": mode, "obs": {"digests": want, "strays": [], "writes": []}}
    assert memory_checks.call_problem(good, case, args) is None
    # a buffer changed, and the worker says nothing of where: still caught, by the digest
    forged = {**good, "obs": {**good["obs"], "digests": [want[0], "0" * 64]}}
    assert "input weight" in memory_checks.call_problem(forged, case, args)
    assert "nn.Parameter with requires_grad=True" in memory_checks.call_problem(forged, case, args)
    # no guard recorded, or a call made in another mode than the one planned
    assert "no guard" in memory_checks.call_problem({**good, "obs": {}}, case, args)
    other = next(m for m in as_passed.MODES if m != mode)
    assert "as the judge planned" in memory_checks.call_problem({**good, "passed_as": other}, case, args)
    # the replay's second call runs on the first case's buffers, in the first case's mode
    first = next(case.replace(seed=s) for s in range(100) if as_passed.mode_for(s) == other)
    assert memory_checks.call_problem({**good, "passed_as": other}, case, args, mode_of=first) is None
