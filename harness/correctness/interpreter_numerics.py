"""The Triton interpreter's tl.dot made to compute what a GPU's tensor cores compute, and its
float-to-integer conversions what a GPU's convert.

The interpreter multiplies tl.dot's operands with numpy as they are stored, which differs from an
NVIDIA GPU in two ways a kernel can hide behind:
- fp32 operands: a GPU (sm_80 and later) multiplies them as TF32 unless the dot says otherwise
  (`input_precision="ieee"`), since TF32 is Triton's default for fp32 dots. The interpreter ignores
  `input_precision` and multiplies in fp32, so a matmul that would be TF32 on every GPU passed the
  fp32 tolerance here. Now the operands are rounded to TF32 (10 mantissa bits, to nearest even)
  where the dot asks for TF32, and split into three TF32 products where it asks for "tf32x3", as
  the GPU does; "ieee" stays fp32.
- bf16 operands: the interpreter stores bf16 as its 16 raw bits (uint16) and multiplied those
  integers, so a bf16 dot product could not be judged at all. Now each operand is widened to fp32
  (exact: bf16 is fp32's upper half) and the products accumulated in fp32, as tensor cores do.

A fourth, conversions to and from bf16: the interpreter truncated fp32 to bf16 (`x.to(tl.bfloat16)`,
which a GPU rounds to nearest even with `cvt.rn.bf16.f32`: 1.999 became 1.9921875 where a GPU gives
2.0, and a value past bf16's largest stayed finite where a GPU gives inf), and converted an
integer, fp64 or fp16 to bf16 (and bf16 to fp64) as raw bits. Now every conversion to bf16 rounds
to nearest even from the exact value, and bf16 is widened exactly first where it is the source; a
down-cast asked with `fp_downcast_rounding="rtz"` keeps the interpreter's truncation.

A third, float-to-integer conversion: numpy gives INT_MIN for a value past the integer type's
range (and for NaN) where a GPU clamps to the range's end (NaN to 0), and the interpreter converted
a bf16 value's raw bits. So a kernel could be right here only because 3e9 became INT_MIN. Now each
conversion clamps as the GPU's does.

`install()` replaces InterpreterBuilder.create_dot and the float-to-integer conversions once per
process; it is called by the launch monitor's install (harness/correctness/launches.py), so the
judge, verify's child and an exported package on the CPU all run them alike. Nothing happens at import.
"""
from __future__ import annotations

import numpy as np

TF32_DROPPED_BITS = 13  # fp32 has 23 mantissa bits, TF32 keeps 10


def _rounded_bits(bits: np.ndarray, dropped: int) -> np.ndarray:
    """fp32 bits (uint32) rounded to nearest even at bit `dropped`, the bits below it cleared; a
    carry out of the largest finite value gives inf. NaN is the caller's to handle."""
    half = np.uint32((1 << (dropped - 1)) - 1) + ((bits >> np.uint32(dropped)) & np.uint32(1))
    return (bits + half) & np.uint32(~((1 << dropped) - 1) & 0xFFFFFFFF)


def round_to_tf32(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to TF32's 10 mantissa bits, to nearest even; Inf and NaN as they are."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, bits, _rounded_bits(bits, TF32_DROPPED_BITS)).view(np.float32)


def bf16_to_fp32(raw: np.ndarray) -> np.ndarray:
    """bf16 values held as their raw uint16 bits, widened to fp32 exactly."""
    return (np.asarray(raw).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _precision_name(input_precision) -> str:
    """'tf32', 'tf32x3', 'ieee', ... from Triton's INPUT_PRECISION enum value (or a string)."""
    name = getattr(input_precision, "name", None) or str(input_precision)
    return name.rsplit(".", 1)[-1].lower()


def dot_operands(a_data: np.ndarray, b_data: np.ndarray, a_is_bf16: bool, b_is_bf16: bool,
                 a_is_fp32: bool, precision: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The pairs of fp32 operands whose products a GPU sums for one dot, or [] to leave the dot to
    the interpreter (fp16, int8, fp8, fp64 and IEEE fp32 it already computes as a GPU does)."""
    if a_is_bf16 or b_is_bf16:
        return [(bf16_to_fp32(a_data) if a_is_bf16 else a_data, bf16_to_fp32(b_data) if b_is_bf16 else b_data)]
    if not a_is_fp32 or precision not in ("tf32", "tf32x3"):
        return []
    a_hi, b_hi = round_to_tf32(a_data), round_to_tf32(b_data)
    if precision == "tf32":
        return [(a_hi, b_hi)]
    # 3xTF32: each operand split into a TF32 high part and a TF32 low part; the low x low product
    # is dropped, as Triton's lowering drops it
    a_lo, b_lo = round_to_tf32(a_data - a_hi), round_to_tf32(b_data - b_hi)
    return [(a_lo, b_hi), (a_hi, b_lo), (a_hi, b_hi)]


def install(monitor=None) -> None:
    """Replace the interpreter's create_dot, once per process (a no-op without the interpreter);
    each dot whose fp32 operands it rounds to TF32 counts in `monitor.tf32_dots`, so a failing fp32
    case can say why."""
    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    if getattr(original, "gpu_numerics", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        pairs = dot_operands(a.data, b.data, a.dtype.scalar == tl.bfloat16, b.dtype.scalar == tl.bfloat16,
                             a.dtype.scalar == tl.float32, _precision_name(input_precision))
        if not pairs:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        if len(pairs) == 1 and a.dtype.scalar == tl.float32 and monitor is not None:
            monitor.tf32_dots += 1
        acc = np.array(d.data, dtype=np.float32, copy=True)
        for x, y in pairs:
            acc = acc + np.matmul(x, y, dtype=np.float32)
        return interpreter.TensorHandle(acc.astype(d.data.dtype, copy=False), d.dtype.scalar)

    create_dot.gpu_numerics = True
    create_dot.__wrapped__ = original
    builder.create_dot = create_dot
    for name in ("create_fp_to_si", "create_fp_to_ui"):
        setattr(builder, name, _saturating(getattr(builder, name), interpreter, tl))
    builder.cast_impl = _bf16_casts(builder.cast_impl, interpreter, tl)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Numbers rounded to bf16 to nearest even (a GPU's cvt.rn.bf16), as raw uint16 bits; past bf16's
    largest finite value, inf; a NaN gives the canonical NaN (0x7fff, as cvt.rn.bf16.f32 does).

    fp32 and narrower in numpy: bf16 is fp32's top half, so the bits rounded at bit 16 (ties to the
    even half, as TF32's at bit 13) are the answer, and a carry out of the largest finite value
    gives inf. Wider values
    (fp64, integers as fp64: rare in a kernel) through PyTorch's conversion, as before."""
    values = np.asarray(values)
    if values.dtype.itemsize > 4:
        import torch
        wide = np.ascontiguousarray(values, dtype=np.float64)
        return torch.from_numpy(wide).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    narrow = np.ascontiguousarray(values, dtype=np.float32)
    rounded = (_rounded_bits(narrow.view(np.uint32), 16) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(narrow), np.uint16(0x7FFF), rounded)


def _bf16_casts(original, interpreter, tl):
    """cast_impl (every int/float conversion but a float-to-integer one and an fp_downcast_rounding
    down-cast) with bf16 on either side converted by value: to bf16 rounded to nearest even."""
    if getattr(original, "gpu_numerics", False):
        return original

    def cast_impl(self, src, dst_type):
        scalar, target = src.dtype.scalar, dst_type.scalar
        if (scalar != tl.bfloat16 and target != tl.bfloat16) or scalar == target:
            return original(self, src, dst_type)
        values = bf16_to_fp32(src.data) if scalar == tl.bfloat16 else np.asarray(src.data)
        if target == tl.bfloat16:
            if values.dtype == np.bool_ or values.dtype.kind in "iu":
                values = values.astype(np.float64)
            return interpreter.TensorHandle(to_bf16_bits(values), target)
        return interpreter.TensorHandle(values.astype(interpreter._get_np_dtype(dst_type)), target)

    cast_impl.gpu_numerics = True
    cast_impl.__wrapped__ = original
    return cast_impl


def float_to_int(values: np.ndarray, int_dtype) -> np.ndarray:
    """Floats converted to `int_dtype` as a GPU converts them (cvt.rzi): toward zero, a value past
    the type's range clamped to its end, NaN to 0. numpy's astype gives INT_MIN past either end.
    An 8-bit type has no cvt of its own: the GPU converts to the 16-bit type of the same sign
    (clamped there) and stores its low byte, so 1e30 becomes int8 -1, not 127."""
    if np.dtype(int_dtype).itemsize == 1:
        wide16 = np.int16 if np.issubdtype(int_dtype, np.signedinteger) else np.uint16
        return float_to_int(values, wide16).astype(int_dtype)  # the low byte, as the store keeps it
    info = np.iinfo(int_dtype)
    wide = np.asarray(values, dtype=np.float64)
    # >= and <=: the float64 nearest to a 64-bit type's end may lie one past it
    high, low = wide >= float(info.max), wide <= float(info.min)
    inside = np.where(np.isnan(wide) | high | low, 0.0, wide).astype(int_dtype)
    return np.where(high, info.max, np.where(low, info.min, inside)).astype(int_dtype)


def _saturating(original, interpreter, tl):
    """create_fp_to_si / create_fp_to_ui converting as a GPU does (float_to_int); a bf16 source
    widened first (the interpreter converted its raw bits as if they were the integer)."""
    if getattr(original, "gpu_numerics", False):
        return original
    widths = {tl.float16: np.float16, tl.float32: np.float32, tl.float64: np.float64}

    def convert(self, src, dst_type):
        scalar = src.dtype.scalar
        if scalar == tl.bfloat16:
            values = bf16_to_fp32(src.data)
        elif scalar in widths:
            values = src.data
        else:  # fp8: as the interpreter converts it
            return original(self, src, dst_type)
        out = float_to_int(values, interpreter._get_np_dtype(dst_type))
        return interpreter.TensorHandle(out, dst_type.scalar)

    convert.gpu_numerics = True
    convert.__wrapped__ = original
    return convert
