"""Matrix product c = a @ b, a [M, K], b [K, N], fp32 accumulation, output in a.dtype.

FLOPs and traffic. 2 * M * N * K FLOPs against a minimum of (M * K + K * N + M * N) * elem_size
bytes: at 4096^3 that is 1.4e11 FLOPs for 1e8 bytes in fp16, far past every GPU's ridge point, so
compute-bound once tiles are reused from on-chip memory. Each program computes one
BLOCK_M x BLOCK_N tile of c, walking K in BLOCK_K steps (pipelined num_stages deep). A tile reads
BLOCK_M * K + K * BLOCK_N elements, so bigger tiles mean fewer bytes per FLOP. Programs are ordered
in groups of GROUP_M tile-rows ("swizzle") so programs running at the same time share rows of a and
columns of b in L2.

Numerics. fp32 operands multiply in IEEE fp32 (input_precision="ieee": no silent TF32); fp16
operands use the tensor cores with an fp32 accumulator. The result is rounded once, at the store.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "matmul"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128], "GROUP_M": [1, 4, 8, 16], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4, 5]}
# at most 128 fp32 accumulators per thread, and the pipelined tiles of a and b within 192 KiB of
# shared memory in fp32 (H100 has 227 KiB per block)
CONSTRAINTS = ["BLOCK_M * BLOCK_N <= 128 * 32 * num_warps", "num_stages * (BLOCK_M + BLOCK_N) * BLOCK_K * 4 <= 196608"]
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}

MIN_DOT_DIM = 16  # tl.dot needs every tile dim to be at least 16


@triton.jit
def _matmul_kernel(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_M * tiles_n
    first_m = (pid // tiles_per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def _block(size: int, dim: int) -> int:
    """A CONFIG block size, shrunk for a dim smaller than it (decode-time M = 1 needs no 128-row
    tile); tl.dot needs at least 16."""
    return min(size, max(MIN_DOT_DIM, triton.next_power_of_2(dim)))


def kernel_fn(a, b):
    k_dim, n = b.shape
    a2 = a.reshape(-1, k_dim)  # leading dims of a are rows of the product
    m = a2.shape[0]
    c = a.new_empty((m, n))
    if c.numel() > 0:
        block_m, block_n = _block(CONFIG["BLOCK_M"], m), _block(CONFIG["BLOCK_N"], n)
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
        _matmul_kernel[grid](
            c, a2, b, m, n, k_dim, a2.stride(0), a2.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=_block(CONFIG["BLOCK_K"], k_dim), GROUP_M=CONFIG["GROUP_M"],
            num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return c.view(*a.shape[:-1], n)
