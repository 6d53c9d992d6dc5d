"""A chain: SiLU(gate) * up, the product a gated MLP feeds its down projection, in one pass.

Unfused, SiLU writes silu(gate) to memory and the product reads it back: 5 * M * N * elem_size
bytes. Fused: gate and up read once, the product written once, 3 * M * N * elem_size bytes; about
6 FLOPs per element (an exp, a reciprocal, two products), so memory-bound. Each program takes one
row and BLOCK_N of its columns; gate and up are read through their strides (the two halves of one
fused gate_up projection are each a strided view).

Numerics. sigmoid in fp32, products in fp32, the output rounded once, in the kernel.

Backward. With s = sigmoid(gate) and g = grad_out:
    dgate = g * up * s * (1 + gate * (1 - s)),    dup = g * gate * s.
The forward saves nothing: s is recomputed from gate. One kernel writes both gradients, reading
gate, up and grad_out once: 5 * M * N * elem_size bytes.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "silu_mul"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [128, 256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3],
            "BWD_BLOCK_N": [128, 256, 512, 1024, 2048, 4096], "BWD_num_warps": [1, 2, 4, 8, 16]}
# every lane busy, and at most 32 fp32 values of a block per thread per operand
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 32 * 32 * num_warps",
               "BWD_BLOCK_N >= 32 * BWD_num_warps", "BWD_BLOCK_N <= 32 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_N": 1024, "num_warps": 4, "num_stages": 2, "BWD_BLOCK_N": 1024, "BWD_num_warps": 4}


@triton.jit
def _silu_mul_kernel(y_ptr, gate_ptr, up_ptr, n_cols, sg_r, sg_c, su_r, su_c, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    gate = tl.load(gate_ptr + row * sg_r + cols * sg_c, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * su_r + cols * su_c, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-gate))
    tl.store(y_ptr + row * n_cols + cols, (gate * s * up).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_bwd_kernel(dgate_ptr, dup_ptr, g_ptr, gate_ptr, up_ptr, n_cols, s_gr, s_gc, sg_r, sg_c, su_r, su_c,
                         BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * s_gr + cols * s_gc, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + row * sg_r + cols * sg_c, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * su_r + cols * su_c, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-gate))
    dgate = g * up * s * (1.0 + gate * (1.0 - s))
    tl.store(dgate_ptr + row * n_cols + cols, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + row * n_cols + cols, (g * gate * s).to(dup_ptr.dtype.element_ty), mask=mask)


def kernel_fn(gate, up):
    n_cols = gate.shape[-1]
    y = gate.new_empty(gate.shape)
    if y.numel() == 0:
        return y
    g2, u2 = gate.reshape(-1, n_cols), up.reshape(-1, n_cols)  # views whenever the layout allows
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(n_cols))
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(n_cols, block_n))](
        y, g2, u2, n_cols, g2.stride(0), g2.stride(1), u2.stride(0), u2.stride(1),
        BLOCK_N=block_n, num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return y


def backward_fn(grad_out, out, gate, up):
    n_cols = gate.shape[-1]
    dgate, dup = gate.new_empty(gate.shape), up.new_empty(up.shape)
    if dgate.numel() == 0:
        return dgate, dup
    g2, u2, o2 = gate.reshape(-1, n_cols), up.reshape(-1, n_cols), grad_out.reshape(-1, n_cols)
    block_n = min(CONFIG["BWD_BLOCK_N"], triton.next_power_of_2(n_cols))
    _silu_mul_bwd_kernel[(g2.shape[0], triton.cdiv(n_cols, block_n))](
        dgate, dup, o2, g2, u2, n_cols, o2.stride(0), o2.stride(1), g2.stride(0), g2.stride(1),
        u2.stride(0), u2.stride(1), BLOCK_N=block_n, num_warps=CONFIG["BWD_num_warps"])
    return dgate, dup
