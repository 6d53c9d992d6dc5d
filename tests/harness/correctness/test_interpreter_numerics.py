"""The interpreter's tl.dot as a GPU computes it (harness/correctness/interpreter_numerics.py): fp32
operands as TF32 unless the dot says "ieee", 3xTF32 for "tf32x3", bf16 operands widened to fp32;
and its float-to-integer conversions as a GPU's: clamped to the range, NaN to 0."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import launches
from harness.correctness.interpreter_numerics import float_to_int, round_to_tf32


@triton.jit
def _dot(c_ptr, a_ptr, b_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, PRECISION: tl.constexpr):
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    if PRECISION == "default":
        c = tl.dot(a, b)
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c)


def _run(a, b, precision):
    launches.install()  # the launch monitor puts the GPU's dot in place, as in every judged process
    c = torch.empty(a.shape[0], b.shape[1])
    _dot[(1,)](c, a, b, M=a.shape[0], K=a.shape[1], N=b.shape[1], PRECISION=precision)
    return c


def test_rounding_to_tf32_keeps_ten_mantissa_bits_to_nearest_even():
    one = 1.0
    values = np.array([one + 2**-11, one + 2**-11 + 2**-20, one + 3 * 2**-11, -2.5, np.inf, -np.inf, np.nan],
                      dtype=np.float32)
    got = round_to_tf32(values)
    assert got[0] == 1.0  # a tie goes to the even neighbour
    assert got[1] == one + 2**-10 and got[2] == one + 2**-9  # past the tie rounds up; 3/2 ulp ties to even (up)
    assert got[3] == -2.5 and np.isposinf(got[4]) and np.isneginf(got[5]) and np.isnan(got[6])
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert np.all(round_to_tf32(x).view(np.uint32) & np.uint32(0x1FFF) == 0)
    assert np.max(np.abs(round_to_tf32(x) - x) / np.abs(x)) <= 2**-11


@pytest.fixture
def operands():
    gen = torch.Generator().manual_seed(3)
    return torch.randn(16, 64, generator=gen), torch.randn(64, 16, generator=gen)


@pytest.mark.parametrize("precision", ["default", "tf32"])
def test_an_fp32_dot_at_the_default_precision_multiplies_tf32_operands(operands, precision):
    a, b = operands
    want = torch.from_numpy(round_to_tf32(a.numpy())) @ torch.from_numpy(round_to_tf32(b.numpy()))
    got = _run(a, b, precision)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-5)
    exact = a.double() @ b.double()
    # what the fp32 tolerance (1e-4 of the row's rms) refuses: a GPU's answer, not the interpreter's
    assert (got.double() - exact).abs().max() > 1e-4 * exact.pow(2).mean().sqrt()


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_ieee_and_3xtf32_stay_within_fp32(operands, precision):
    a, b = operands
    exact = a.double() @ b.double()
    err = (_run(a, b, precision).double() - exact).abs().max() / exact.pow(2).mean().sqrt()
    assert err < 1e-5


def test_a_bf16_dot_widens_its_operands_and_sums_in_fp32(operands):
    a, b = (t.to(torch.bfloat16) for t in operands)
    got = _run(a, b, "default")
    want = a.double() @ b.double()  # bf16 products are exact in fp32; the sums round in fp32
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()


def test_float_to_int_clamps_past_the_range_and_sends_nan_to_zero():
    values = np.array([3e9, -3e9, np.inf, -np.inf, np.nan, 2.9, -2.9, 2147483647.0, -2147483648.0, 1e30])
    got = float_to_int(values, np.int32)
    assert got.dtype == np.int32
    assert got.tolist() == [2**31 - 1, -(2**31), 2**31 - 1, -(2**31), 0, 2, -2, 2**31 - 1, -(2**31), 2**31 - 1]
    # 8 bits: cvt.rzi.s16 / .u16 (clamped to 16 bits), its low byte stored (sm_90's PTX for .to(tl.int8))
    assert float_to_int(np.array([200.0, -200.0, 127.9, 1e30, -1e30]), np.int8).tolist() == [-56, 56, 127, -1, 0]
    assert float_to_int(np.array([-5.0, 300.0, 1e9]), np.uint8).tolist() == [0, 44, 255]
    assert float_to_int(np.array([-5.0, 3e9, 5e9]), np.uint32).tolist() == [0, 3_000_000_000, 2**32 - 1]
    assert float_to_int(np.array([1e19, -1e19, 2.0**62]), np.int64).tolist() == [2**63 - 1, -(2**63), 2**62]
    with np.errstate(invalid="ignore"):  # what the interpreter's numpy did: INT_MIN past either end
        assert np.array([3e9]).astype(np.int32)[0] == -(2**31)


@triton.jit
def _to_int(out32_ptr, out8_ptr, outu_ptr, x_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(out32_ptr + offs, x.to(tl.int32))
    tl.store(out8_ptr + offs, x.to(tl.int8))
    tl.store(outu_ptr + offs, x.to(tl.uint32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_kernel_converts_floats_to_ints_as_a_gpu_does(dtype):
    launches.install()
    x = torch.tensor([3e9, -3e9, float("nan"), float("inf"), 200.0, -200.0, 2.75, -2.75]).to(dtype)
    out32, out8 = torch.empty(8, dtype=torch.int32), torch.empty(8, dtype=torch.int8)
    outu = torch.empty(8, dtype=torch.uint32)
    _to_int[(1,)](out32, out8, outu, x, N=8)
    wide = x.double().numpy()
    assert out32.tolist() == float_to_int(wide, np.int32).tolist()
    assert out8.tolist() == float_to_int(wide, np.int8).tolist() == [-1, 0, 0, -1, -56, 56, 2, -2]
    assert outu.tolist() == float_to_int(wide, np.uint32).tolist()
    if dtype == torch.float32:  # fp16 and bf16 hold inf, not 3e9, past 65504 / round it
        assert out32.tolist()[:4] == [2**31 - 1, -(2**31), 0, 2**31 - 1]


@triton.jit
def _to_bf16(y_ptr, i_ptr, h_ptr, d_ptr, z_ptr, x_ptr, n_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    tl.store(y_ptr + lanes, x.to(tl.bfloat16))
    tl.store(i_ptr + lanes, tl.load(n_ptr + lanes).to(tl.bfloat16))
    tl.store(h_ptr + lanes, x.to(tl.float16).to(tl.bfloat16))
    tl.store(d_ptr + lanes, x.to(tl.bfloat16).to(tl.float64))
    tl.store(z_ptr + lanes, x.to(tl.bfloat16, fp_downcast_rounding="rtz"))


def test_every_conversion_to_bf16_rounds_to_nearest_even_as_a_gpus_cvt_rn():
    launches.install()
    x = torch.tensor([1.999, 1.005859, 3.4e38, -2.5, 1e-40, float("nan"), float("inf"), 0.1])
    n = torch.tensor([1, 257, 16777217, -3, 0, 2**30 + 1, 7, -1000001], dtype=torch.int32)
    y, i, h, z = (torch.empty(8, dtype=torch.bfloat16) for _ in range(4))
    d = torch.empty(8, dtype=torch.float64)
    _to_bf16[(1,)](y, i, h, d, z, x, n, BLOCK=8)
    real = ~x.isnan()
    # torch rounds to nearest even, as cvt.rn.bf16.f32 does: 1.999 -> 2.0 (truncated: 1.9921875),
    # 3.4e38 past bf16's largest -> inf (truncated: finite)
    assert torch.equal(y[real].view(torch.int16), x[real].to(torch.bfloat16).view(torch.int16)) and y[5].isnan()
    assert y[0].item() == 2.0 and y[2].item() == float("inf")
    assert torch.equal(i, n.to(torch.bfloat16))  # an integer by value, not its bits
    assert torch.equal(h[real], x[real].to(torch.float16).to(torch.bfloat16))
    assert torch.equal(d[real], x[real].to(torch.bfloat16).double())  # bf16 widened by value
    assert z[0].item() == 1.9921875  # round toward zero where the kernel asks for it


def test_fp32_to_bf16_bits_agree_with_pytorchs_rounding_on_every_kind_of_value():
    """The judge's fp32 -> bf16 conversion is numpy bit arithmetic (a PyTorch conversion per cast
    cost a dispatched op, watched, in every program): the same bits as PyTorch's round to nearest
    even on a million random patterns and the edges (ties either way, the largest finite values of
    both signs carrying into inf, subnormals, zeros); NaN gives the GPU's canonical NaN."""
    from harness.correctness.interpreter_numerics import to_bf16_bits
    edges = np.array([0, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F800000, 0xFF800000,
                      0x3F808000, 0x3F818000, 0x3F807FFF, 0x00008000, 0x00018000, 0x00000001, 0x807FFFFF],
                     dtype=np.uint32)
    bits = np.concatenate([edges, np.random.default_rng(3).integers(0, 2**32, 1_000_000, dtype=np.uint64)
                           .astype(np.uint32)])
    values = bits.view(np.float32)
    nan = np.isnan(values)
    want = torch.from_numpy(values[~nan].copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    got = to_bf16_bits(values)
    assert np.array_equal(got[~nan], want)
    assert (got[nan] == 0x7FFF).all() and nan.sum() > 1000
    assert to_bf16_bits(np.float32(1.999)) == 0x4000 and to_bf16_bits(np.float32(3.4e38)) == 0x7F80
    assert to_bf16_bits(np.array([1.5, -65504.0], dtype=np.float16)).tolist() == [0x3FC0, 0xC780]  # fp16 in
