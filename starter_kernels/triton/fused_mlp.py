"""SwiGLU MLP: out = (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T, in two kernels.

x [M, D]; w_gate, w_up [F, D]; w_down [D, F] (nn.Linear layout: the weights are read in place, as
[F, D] and [D, F] row-major tiles, never copied or transposed in memory).

Kernel 1, gate and up in one GEMM pass: a program computes the gate tile and the up tile of the
same BLOCK_M x BLOCK_N block of h [M, F] from the same x tiles (x is read once for both products),
applies SiLU and the product to the two fp32 accumulators in registers, and writes h once, in the
input dtype. Neither projection and no [M, 2F] intermediate is ever written. Kernel 2 is the down
projection h @ w_down.T, the matmul starter's kernel with b read through its transpose. It holds
BLOCK_M x 2 * BLOCK_N accumulators, as many as kernel 1's two tiles, so one CONFIG sizes both.

Schedule (as the matmul starter). Both kernels are persistent: one program per multiprocessor,
walking output tiles in grouped order (GROUP_M tile-rows at a time, for L2 reuse), the tile loop and
the K loop flattened into one software pipeline num_stages deep. Tiles are halved, N first, down to
64, while they would leave multiprocessors idle; before Hopper the gate and up tiles are BLOCK_N / 2
wide (two accumulators and their register-held operands must fit 255 registers). With TMA = 1, on Hopper and later, 16-bit operands
whose rows are 16-byte aligned are loaded and stored through host-built tensor descriptors (TMA
bulk copies, zero-filled at the edges, no masks in the mainloop); the interpreter runs them too, so
the CPU judge checks them on aligned fp16 cases. Otherwise pointer loads, with rows and columns
past the edge clamped to row 0 instead of masked. BLOCK_N and BLOCK_K count 16-bit elements: fp32
operands use half of each, so a configuration takes the same shared memory in every dtype.

FLOPs and traffic. 6 * M * D * F FLOPs for the three products (plus 4 * M * F for the epilogue)
against (2 * M * D + 3 * D * F) * elem_size bytes of inputs and output, and 2 * M * F * elem_size
for h written and read back: at M = 4096, D = 4096, F = 11008 (LLaMA-7B) that is 1.1e12 FLOPs for
0.4 GB in fp16, compute-bound. The unfused eager form also writes and re-reads both projections
and the SiLU output.

Numerics. fp32 operands multiply in IEEE fp32 (input_precision="ieee": no silent TF32); fp16 and
bf16 operands use the tensor cores with fp32 accumulators. h is stored in the input dtype (one
rounding before the down projection, as eager rounds each projection), the output is rounded once.

Backward. With G = x @ w_gate.T, U = x @ w_up.T, s = sigmoid(G), h = G * s * U and upstream g:
    dh = g @ w_down,  dU = dh * G * s,  dG = dh * U * s * (1 + G * (1 - s)),
    dx = dG @ w_gate + dU @ w_up,  dw_gate = dG^T @ x,  dw_up = dU^T @ x,  dw_down = g^T @ h.
The forward saves nothing: kernel B1 recomputes G and U from x (the forward's gate/up GEMM) and
computes dh in the same K loop (g [M, D] against w_down [D, F] shares the K = D walk), holding
three fp32 accumulators, and writes h, dG and dU once each in the input dtype (as eager rounds each
projection's gradient). Kernel B2, a strided matmul with an optional second product summed into
the same accumulator, then makes dx (both products in one pass over K = F) and the three weight
gradients on transposed views (sums over the M rows inside each tile's K loop, in fp32; no copy).
FLOPs: 3 * 2 * M * D * F in B1, 4 * 2 * M * D * F in B2: 14 * M * D * F, 2.3x the forward's,
compute-bound. The backward uses pointer loads only (transposed operands have no contiguous last
dim for descriptors), under the BWD_ tiles.
"""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

KERNEL_TYPE = "fused_mlp"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 4, 8, 16], "TMA": [0, 1], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4],
            "BWD_BLOCK_M": [16, 32, 64, 128], "BWD_BLOCK_N": [16, 32, 64, 128], "BWD_BLOCK_K": [16, 32, 64, 128], "BWD_GROUP_M": [1, 4, 8, 16], "BWD_num_warps": [2, 4, 8], "BWD_num_stages": [1, 2, 3, 4]}
# Both kernels hold 2 * BLOCK_M * BLOCK_N fp32 accumulators: at most 128 per thread, and with the
# operand tiles held for the tensor-core instructions about 200 registers. Their pipelined tiles
# stay within sm_80's 163 KiB of shared memory, and with the TMA store's output tile within
# sm_90's 227 KiB. The backward's first kernel holds three BWD_BLOCK_M x BWD_BLOCK_N accumulators
# and five operand tiles.
CONSTRAINTS = ["2 * BLOCK_M * BLOCK_N <= 128 * 32 * num_warps", "2 * BLOCK_M * BLOCK_N + (BLOCK_M + 2 * BLOCK_N) * BLOCK_K // 2 <= 200 * 32 * num_warps", "num_stages * (BLOCK_M + 2 * BLOCK_N) * BLOCK_K * 2 <= 160 * 1024", "TMA == 0 or num_stages * (BLOCK_M + 2 * BLOCK_N) * BLOCK_K * 2 + 4 * BLOCK_M * BLOCK_N <= 220 * 1024",
               "3 * BWD_BLOCK_M * BWD_BLOCK_N <= 128 * 32 * BWD_num_warps", "3 * BWD_BLOCK_M * BWD_BLOCK_N + (2 * BWD_BLOCK_M + 3 * BWD_BLOCK_N) * BWD_BLOCK_K // 2 <= 200 * 32 * BWD_num_warps", "BWD_num_stages * (2 * BWD_BLOCK_M + 3 * BWD_BLOCK_N) * BWD_BLOCK_K * 2 <= 160 * 1024"]
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 1, "num_warps": 8, "num_stages": 3,
          "BWD_BLOCK_M": 64, "BWD_BLOCK_N": 64, "BWD_BLOCK_K": 32, "BWD_GROUP_M": 8, "BWD_num_warps": 8, "BWD_num_stages": 2}

MIN_DOT_DIM = 16  # tl.dot needs every tile dim to be at least 16
MIN_FILL_BLOCK = 64  # tiles are not halved below this to fill the multiprocessors
CPU_PROGRAMS = 4  # the interpreter has no multiprocessors: a few programs, each walking many tiles


@triton.jit
def _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Row and column of output tile `tile_id`, GROUP_M tile-rows at a time (L2 reuse)."""
    per_group = GROUP_M * tiles_n
    first_m = (tile_id // per_group) * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    return first_m + (tile_id % per_group) % rows, (tile_id % per_group) // rows


@triton.jit
def _clamped(offs, limit, BLOCK: tl.constexpr):
    """Offsets past `limit` read index 0 (in bounds, never stored); the hints keep the loads wide."""
    return tl.max_contiguous(tl.multiple_of(tl.where(offs < limit, offs, 0), BLOCK), BLOCK)


@triton.jit
def _gate_up_tma_kernel(h_desc, x_desc, wg_desc, wu_desc, M, F, D, PROGRAMS, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(F, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(D, BLOCK_K)):
            x = x_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            gate = tl.dot(x, wg_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T, gate, input_precision="ieee")
            up = tl.dot(x, wu_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T, up, input_precision="ieee")
        h = gate * tl.sigmoid(gate) * up
        h_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], h.to(h_desc.dtype))


@triton.jit
def _gate_up_kernel(h_ptr, x_ptr, wg_ptr, wu_ptr, M, F, D, PROGRAMS, stride_xm, stride_xd, stride_gf,
                    stride_gd, stride_uf, stride_ud, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(F, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_f = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows, cols = _clamped(offs_m, M, BLOCK_M), _clamped(offs_f, F, BLOCK_N)
        x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xd
        # [BLOCK_K, BLOCK_N] tiles of w.T, read in place from the [F, D] weights
        wg_ptrs = wg_ptr + offs_k[:, None] * stride_gd + cols[None, :] * stride_gf
        wu_ptrs = wu_ptr + offs_k[:, None] * stride_ud + cols[None, :] * stride_uf
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(D, BLOCK_K)):
            k_left = D - ki * BLOCK_K
            x = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            gate = tl.dot(x, tl.load(wg_ptrs, mask=offs_k[:, None] < k_left, other=0.0), gate,
                          input_precision="ieee")
            up = tl.dot(x, tl.load(wu_ptrs, mask=offs_k[:, None] < k_left, other=0.0), up,
                        input_precision="ieee")
            x_ptrs += BLOCK_K * stride_xd
            wg_ptrs += BLOCK_K * stride_gd
            wu_ptrs += BLOCK_K * stride_ud
        h = gate * tl.sigmoid(gate) * up
        h_ptrs = h_ptr + offs_m[:, None] * F + offs_f[None, :]
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_f[None, :] < F))


@triton.jit
def _down_tma_kernel(out_desc, h_desc, w_desc, M, N, K, PROGRAMS, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out = h @ w.T, w [N, K] row-major (nn.Linear), loaded as [BLOCK_N, BLOCK_K] tiles."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            h = h_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            acc = tl.dot(h, w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T, acc, input_precision="ieee")
        out_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(out_desc.dtype))


@triton.jit
def _down_kernel(out_ptr, h_ptr, w_ptr, M, N, K, PROGRAMS, stride_wn, stride_wk, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out = h @ w.T for a contiguous h [M, K] and w [N, K] of any strides."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows, cols = _clamped(offs_m, M, BLOCK_M), _clamped(offs_n, N, BLOCK_N)
        h_ptrs = h_ptr + rows[:, None] * K + offs_k[None, :]
        w_ptrs = w_ptr + offs_k[:, None] * stride_wk + cols[None, :] * stride_wn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            k_left = K - ki * BLOCK_K
            h = tl.load(h_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc = tl.dot(h, w, acc, input_precision="ieee")
            h_ptrs += BLOCK_K
            w_ptrs += BLOCK_K * stride_wk
        out_ptrs = out_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _block(size: int, dim: int) -> int:
    """A block size, shrunk for a dim smaller than it; tl.dot needs at least 16."""
    return min(size, max(MIN_DOT_DIM, triton.next_power_of_2(dim)))


def _tma_device(device: torch.device) -> bool:
    """Hopper and later: TMA descriptors pay, and warpgroup MMAs keep their operands in shared
    memory. Earlier GPUs take the pointer kernels. The interpreter runs either."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def _programs(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAMS


def _launch(m: int, n: int, k: int, block_n: int, elem_size: int, programs: int) -> tuple[tuple, dict]:
    """Grid and launch options of an [m, k] x [k, n] kernel with BLOCK_N = block_n (16-bit
    elements): fitted to small dims, halved (N first) while tiles would leave programs idle."""
    block_m = _block(CONFIG["BLOCK_M"], m)
    block_n = _block(max(MIN_DOT_DIM, block_n * 2 // elem_size), n)
    while triton.cdiv(m, block_m) * triton.cdiv(n, block_n) < programs:
        if block_n > MIN_FILL_BLOCK and block_n >= block_m:
            block_n //= 2
        elif block_m > MIN_FILL_BLOCK:
            block_m //= 2
        else:
            break
    block_k = _block(max(MIN_DOT_DIM, CONFIG["BLOCK_K"] * 2 // elem_size), k)
    grid = (min(programs, triton.cdiv(m, block_m) * triton.cdiv(n, block_n)),)
    return grid, dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=CONFIG["GROUP_M"],
                      num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])


def _tma_ok(*tensors) -> bool:
    """16-bit 2-D tensors with a 16-byte aligned base and rows and a contiguous last dim."""
    return all(t.dim() == 2 and t.element_size() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
               and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors)


def _desc(t, rows: int, cols: int):
    return TensorDescriptor.from_tensor(t, [rows, cols])


def kernel_fn(x, w_gate, w_up, w_down):
    d_model = x.shape[-1]
    d_ff = w_gate.shape[0]
    x2 = x.reshape(-1, d_model)  # leading dims of x are tokens
    m = x2.shape[0]
    out = x.new_empty((m, d_model))
    if out.numel() == 0:
        return out.view(x.shape)
    h = x.new_empty((m, d_ff))
    programs, es = _programs(x.device), x.element_size()
    tma = CONFIG["TMA"] and _tma_device(x.device) and _tma_ok(x2, w_gate, w_up, w_down, h, out)
    # before Hopper the two accumulators, their operands and the register prefetch of the next
    # operands do not fit 255 registers at BLOCK_N = 128: half-width gate and up tiles there
    gate_n = CONFIG["BLOCK_N"] if _tma_device(x.device) else CONFIG["BLOCK_N"] // 2
    grid, meta = _launch(m, d_ff, d_model, gate_n, es, programs)
    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    if tma:
        _gate_up_tma_kernel[grid](_desc(h, bm, bn), _desc(x2, bm, bk), _desc(w_gate, bn, bk),
                                  _desc(w_up, bn, bk), m, d_ff, d_model, grid[0], **meta)
    else:
        _gate_up_kernel[grid](h, x2, w_gate, w_up, m, d_ff, d_model, grid[0], *x2.stride(),
                              *w_gate.stride(), *w_up.stride(), **meta)
    grid, meta = _launch(m, d_model, d_ff, 2 * CONFIG["BLOCK_N"], es, programs)
    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    if tma:
        _down_tma_kernel[grid](_desc(out, bm, bn), _desc(h, bm, bk), _desc(w_down, bn, bk), m, d_model,
                               d_ff, grid[0], **meta)
    else:
        _down_kernel[grid](out, h, w_down, m, d_model, d_ff, grid[0], *w_down.stride(), **meta)
    return out.view(x.shape)


@triton.jit
def _gate_up_bwd_kernel(h_ptr, dg_ptr, du_ptr, x_ptr, wg_ptr, wu_ptr, g_ptr, wd_ptr, M, F, D,
                        stride_xm, stride_xd, stride_gf, stride_gd, stride_uf, stride_ud,
                        stride_om, stride_od, stride_wdd, stride_wdf, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """h, dG, dU [M, F] (contiguous) from x, the gate and up weights, grad_out g [M, D] and w_down."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tiles_m, tl.cdiv(F, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_f = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows, cols = _clamped(offs_m, M, BLOCK_M), _clamped(offs_f, F, BLOCK_N)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xd
    g_ptrs = g_ptr + rows[:, None] * stride_om + offs_k[None, :] * stride_od
    wg_ptrs = wg_ptr + offs_k[:, None] * stride_gd + cols[None, :] * stride_gf
    wu_ptrs = wu_ptr + offs_k[:, None] * stride_ud + cols[None, :] * stride_uf
    wd_ptrs = wd_ptr + offs_k[:, None] * stride_wdd + cols[None, :] * stride_wdf
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    dh = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(D, BLOCK_K)):
        k_row = offs_k[None, :] < D - ki * BLOCK_K
        k_col = offs_k[:, None] < D - ki * BLOCK_K
        x = tl.load(x_ptrs, mask=k_row, other=0.0)
        gate = tl.dot(x, tl.load(wg_ptrs, mask=k_col, other=0.0), gate, input_precision="ieee")
        up = tl.dot(x, tl.load(wu_ptrs, mask=k_col, other=0.0), up, input_precision="ieee")
        dh = tl.dot(tl.load(g_ptrs, mask=k_row, other=0.0), tl.load(wd_ptrs, mask=k_col, other=0.0), dh,
                    input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xd
        g_ptrs += BLOCK_K * stride_od
        wg_ptrs += BLOCK_K * stride_gd
        wu_ptrs += BLOCK_K * stride_ud
        wd_ptrs += BLOCK_K * stride_wdd
    sig = tl.sigmoid(gate)
    silu = gate * sig
    out = offs_m[:, None] * F + offs_f[None, :]
    ok = (offs_m[:, None] < M) & (offs_f[None, :] < F)
    tl.store(h_ptr + out, (silu * up).to(h_ptr.dtype.element_ty), mask=ok)
    tl.store(du_ptr + out, (dh * silu).to(du_ptr.dtype.element_ty), mask=ok)
    tl.store(dg_ptr + out, (dh * up * sig * (1.0 + gate * (1.0 - sig))).to(dg_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _product_kernel(c_ptr, a_ptr, b_ptr, a2_ptr, b2_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                    stride_bn, stride_a2m, stride_a2k, stride_b2k, stride_b2n, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    TWO: tl.constexpr):
    """c [M, N] (contiguous) = a @ b, plus a2 @ b2 when TWO, for operands of any strides."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows, cols = _clamped(offs_m, M, BLOCK_M), _clamped(offs_n, N, BLOCK_N)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
    a2_ptrs = a2_ptr + rows[:, None] * stride_a2m + offs_k[None, :] * stride_a2k
    b2_ptrs = b2_ptr + offs_k[:, None] * stride_b2k + cols[None, :] * stride_b2n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(tl.cdiv(K, BLOCK_K)):
        k_row = offs_k[None, :] < K - ki * BLOCK_K
        k_col = offs_k[:, None] < K - ki * BLOCK_K
        acc = tl.dot(tl.load(a_ptrs, mask=k_row, other=0.0), tl.load(b_ptrs, mask=k_col, other=0.0), acc,
                     input_precision="ieee")
        if TWO:
            acc = tl.dot(tl.load(a2_ptrs, mask=k_row, other=0.0), tl.load(b2_ptrs, mask=k_col, other=0.0),
                         acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        a2_ptrs += BLOCK_K * stride_a2k
        b2_ptrs += BLOCK_K * stride_b2k
    c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _bwd_meta(m: int, n: int, k: int, elem_size: int) -> tuple[tuple, dict]:
    """Grid (one program per tile) and launch options of a backward kernel over an [m, n] output."""
    block_m = _block(CONFIG["BWD_BLOCK_M"], m)
    block_n = _block(max(MIN_DOT_DIM, CONFIG["BWD_BLOCK_N"] * 2 // elem_size), n)
    block_k = _block(max(MIN_DOT_DIM, CONFIG["BWD_BLOCK_K"] * 2 // elem_size), k)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    return grid, dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=CONFIG["BWD_GROUP_M"],
                      num_warps=CONFIG["BWD_num_warps"], num_stages=CONFIG["BWD_num_stages"])


def _product(a, b, a2=None, b2=None):
    """a @ b (+ a2 @ b2) into a new contiguous tensor in a's dtype, any operand strides."""
    m, k = a.shape
    n = b.shape[1]
    c = a.new_empty((m, n))
    if c.numel() == 0:
        return c
    grid, meta = _bwd_meta(m, n, k, a.element_size())
    two = a2 is not None
    a2, b2 = (a2, b2) if two else (a, b)
    _product_kernel[grid](c, a, b, a2, b2, m, n, k, *a.stride(), *b.stride(), *a2.stride(), *b2.stride(),
                          TWO=two, **meta)
    return c


def backward_fn(grad_out, out, x, w_gate, w_up, w_down):
    d_model = x.shape[-1]
    d_ff = w_gate.shape[0]
    x2 = x.reshape(-1, d_model)
    g2 = grad_out.reshape(-1, d_model)
    m = x2.shape[0]
    h, dg, du = (x.new_empty((m, d_ff)) for _ in range(3))
    if m and d_ff:
        grid, meta = _bwd_meta(m, d_ff, d_model, x.element_size())
        _gate_up_bwd_kernel[grid](h, dg, du, x2, w_gate, w_up, g2, w_down, m, d_ff, d_model, *x2.stride(),
                                  *w_gate.stride(), *w_up.stride(), *g2.stride(), *w_down.stride(), **meta)
    dx = _product(dg, w_gate, du, w_up)
    return dx.view(x.shape), _product(dg.T, x2), _product(du.T, x2), _product(g2.T, h)
