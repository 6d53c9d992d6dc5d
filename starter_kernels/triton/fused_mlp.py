"""SwiGLU MLP: out = (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T, in two kernels.

x [M, D]; w_gate, w_up [F, D]; w_down [D, F] (nn.Linear layout: the weights are read transposed
through their strides, never copied).

Kernel 1 computes h = silu(x @ w_gate.T) * (x @ w_up.T) for one BLOCK_M x BLOCK_N tile of h [M, F]:
both products share every x tile it loads, and the SiLU and the product happen on the fp32
accumulators, so neither projection is ever written out. Kernel 2 is h @ w_down.T. Both order
their programs in groups of GROUP_M tile-rows so that programs running together share L2.

FLOPs and traffic. 6 * M * D * F FLOPs for the three products (plus 4 * M * F for the epilogue)
against (2 * M * D + 3 * D * F) * elem_size bytes of inputs and output, and 2 * M * F * elem_size
for h written and read back: at M = 4096, D = 4096, F = 11008 (LLaMA-7B) that is 1.1e12 FLOPs for
0.4 GB in fp16, compute-bound. The unfused eager form also writes and re-reads both projections
and the SiLU output.

Numerics. fp32 operands multiply in IEEE fp32 (input_precision="ieee": no silent TF32); fp16
operands use the tensor cores with fp32 accumulators. h is stored in the input dtype (for fp16,
one rounding of relative size 2^-11 before the down projection), the output is rounded once.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "fused_mlp"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 4, 8, 16], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4]}
# Kernel 1 keeps two BLOCK_M x BLOCK_N fp32 accumulators: at most 128 of them per thread. Its
# pipelined x, w_gate and w_up tiles stay within 192 KiB of shared memory in fp32.
CONSTRAINTS = ["2 * BLOCK_M * BLOCK_N <= 128 * 32 * num_warps", "num_stages * (BLOCK_M + 2 * BLOCK_N) * BLOCK_K * 4 <= 196608"]
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}

MIN_DOT_DIM = 16  # tl.dot needs every tile dim to be at least 16


@triton.jit
def _grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile coordinates of program `pid`, GROUP_M tile-rows at a time (L2 reuse)."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_rows = min(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _gate_up_kernel(h_ptr, x_ptr, wg_ptr, wu_ptr, M, F, D, stride_xm, stride_xd, stride_gf,
                    stride_gd, stride_uf, stride_ud, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, F, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xd
    # [BLOCK_K, BLOCK_N] tiles of w.T, read in place from the [F, D] weights
    wg_ptrs = wg_ptr + offs_k[:, None] * stride_gd + offs_f[None, :] * stride_gf
    wu_ptrs = wu_ptr + offs_k[:, None] * stride_ud + offs_f[None, :] * stride_uf
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(D, BLOCK_K)):
        k_left = D - k * BLOCK_K
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        w_mask = (offs_k[:, None] < k_left) & (offs_f[None, :] < F)
        gate = tl.dot(x, tl.load(wg_ptrs, mask=w_mask, other=0.0), gate, input_precision="ieee")
        up = tl.dot(x, tl.load(wu_ptrs, mask=w_mask, other=0.0), up, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xd
        wg_ptrs += BLOCK_K * stride_gd
        wu_ptrs += BLOCK_K * stride_ud
    h = gate * tl.sigmoid(gate) * up
    h_ptrs = h_ptr + offs_m[:, None] * F + offs_f[None, :]
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_f[None, :] < F))


@triton.jit
def _down_kernel(out_ptr, h_ptr, wd_ptr, M, D, F, stride_wd, stride_wf, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, D, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    h_ptrs = h_ptr + offs_m[:, None] * F + offs_k[None, :]
    # [BLOCK_K, BLOCK_N] tiles of w_down.T, read in place from the [D, F] weight
    wd_ptrs = wd_ptr + offs_k[:, None] * stride_wf + offs_d[None, :] * stride_wd
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(F, BLOCK_K)):
        k_left = F - k * BLOCK_K
        h = tl.load(h_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        w = tl.load(wd_ptrs, mask=(offs_k[:, None] < k_left) & (offs_d[None, :] < D), other=0.0)
        acc = tl.dot(h, w, acc, input_precision="ieee")
        h_ptrs += BLOCK_K
        wd_ptrs += BLOCK_K * stride_wf
    out_ptrs = out_ptr + offs_m[:, None] * D + offs_d[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_d[None, :] < D))


def _blocks(m: int, n: int, k: int) -> dict:
    """Launch options for an [m, k] @ [k, n] product: CONFIG's block sizes, each shrunk for a dim
    smaller than it (decode-time M = 1 needs no 128-row tile); tl.dot needs at least 16."""
    def fit(name: str, dim: int) -> int:
        return min(CONFIG[name], max(MIN_DOT_DIM, triton.next_power_of_2(dim)))
    return dict(BLOCK_M=fit("BLOCK_M", m), BLOCK_N=fit("BLOCK_N", n), BLOCK_K=fit("BLOCK_K", k),
                GROUP_M=CONFIG["GROUP_M"], num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])


def kernel_fn(x, w_gate, w_up, w_down):
    d_model = x.shape[-1]
    d_ff = w_gate.shape[0]
    x2 = x.reshape(-1, d_model)  # leading dims of x are tokens
    m = x2.shape[0]
    out = x.new_empty((m, d_model))
    if out.numel() == 0:
        return out.view(x.shape)
    h = x.new_empty((m, d_ff))
    up = _blocks(m, d_ff, d_model)
    _gate_up_kernel[(triton.cdiv(m, up["BLOCK_M"]) * triton.cdiv(d_ff, up["BLOCK_N"]),)](
        h, x2, w_gate, w_up, m, d_ff, d_model, *x2.stride(), *w_gate.stride(), *w_up.stride(), **up)
    down = _blocks(m, d_model, d_ff)
    _down_kernel[(triton.cdiv(m, down["BLOCK_M"]) * triton.cdiv(d_model, down["BLOCK_N"]),)](
        out, h, w_down, m, d_model, d_ff, *w_down.stride(), **down)
    return out.view(x.shape)
