"""Second CONFIGs of the starter kernels, shared by the tests of their files, their judged results
and their compiled code."""
from __future__ import annotations

from starter_kernels import starter_path

# Triton: smaller blocks than the defaults: rows longer than a block take the chunked loops, products span
# many tiles and several GROUP_M swizzle groups, and attention visits several key blocks narrower
# than its query block, so the causal diagonal crosses more than one of them. The backwards' BWD_ blocks
# are smaller still: rows of 256 take the chunked loops, and more programs share the weight gradients.
TRITON = {
    "softmax": {"BLOCK_N": 1024, "num_warps": 4, "num_stages": 1, "BWD_BLOCK_N": 256, "BWD_num_warps": 2},
    "layernorm": {"BLOCK_N": 1024, "num_warps": 4, "num_stages": 1, "BWD_BLOCK_N": 256, "BWD_num_warps": 2,
                  "BWD_PROGRAMS_PER_SM": 2},
    "rmsnorm": {"BLOCK_N": 1024, "num_warps": 2, "num_stages": 3, "BWD_BLOCK_N": 256, "BWD_num_warps": 4,
                "BWD_PROGRAMS_PER_SM": 4},
    "reduce": {"BLOCK_N": 256, "num_warps": 2, "num_stages": 1, "BWD_BLOCK_N": 256, "BWD_num_warps": 2},
    "cross_entropy": {"BLOCK_V": 1024, "num_warps": 4, "num_stages": 1, "BWD_BLOCK_V": 256, "BWD_num_warps": 2},
    "rotary_embedding": {"BLOCK_S": 16, "num_warps": 2, "num_stages": 1, "BWD_BLOCK_S": 8, "BWD_num_warps": 2},
    "matmul": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 4, "TMA": 0, "num_warps": 4, "num_stages": 2,
               "BWD_BLOCK_M": 16, "BWD_BLOCK_N": 32, "BWD_BLOCK_K": 16, "BWD_GROUP_M": 4, "BWD_num_warps": 4, "BWD_num_stages": 2},
    "fused_mlp": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "TMA": 0, "num_warps": 4, "num_stages": 2,
                  "BWD_BLOCK_M": 16, "BWD_BLOCK_N": 32, "BWD_BLOCK_K": 16, "BWD_GROUP_M": 4, "BWD_num_warps": 4, "BWD_num_stages": 2},
    "flash_attention": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "BWD_BLOCK_M": 16, "BWD_BLOCK_N": 32,
                        "BWD_num_warps": 4, "BWD_num_stages": 1},
    # chains: rows swept in chunks, the vocabulary and D in several tiles, more programs on the weight
    "add_rmsnorm": {"BLOCK_N": 256, "num_warps": 2, "num_stages": 1, "BWD_BLOCK_N": 256, "BWD_num_warps": 2,
                    "BWD_PROGRAMS_PER_SM": 4},
    "silu_mul": {"BLOCK_N": 128, "num_warps": 2, "num_stages": 1, "BWD_BLOCK_N": 256, "BWD_num_warps": 2},
    "rotary_qk": {"BLOCK_S": 8, "num_warps": 2, "num_stages": 1, "BWD_BLOCK_S": 4, "BWD_num_warps": 2},
    "linear_cross_entropy": {"BLOCK_M": 16, "BLOCK_V": 32, "BLOCK_K": 16, "num_warps": 2, "num_stages": 1,
                             "BWD_BLOCK_M": 16, "BWD_BLOCK_V": 16, "BWD_BLOCK_D": 16, "BWD_num_warps": 2},
}

# CUDA C++: other corners of each tuning space: a different block size, tiles of other shapes (matmul's and
# fused_mlp's warp tiles no longer square), attention with fewer, fuller warps.
CUDA = {
    "softmax": {"THREADS": 1024},
    "layernorm": {"THREADS": 64},
    "rmsnorm": {"THREADS": 512},
    "reduce": {"THREADS": 128, "UNROLL": 1},
    "cross_entropy": {"THREADS": 128},
    "rotary_embedding": {"THREADS": 32},
    "matmul": {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 8, "THREAD_M": 2, "THREAD_N": 8, "TC_BLOCK_M": 128,
               "TC_BLOCK_N": 32, "TC_BLOCK_K": 16, "TC_WARP_M": 64, "TC_WARP_N": 16},
    "fused_mlp": {"BLOCK_M": 32, "BLOCK_N": 128, "BLOCK_K": 8, "THREAD_M": 2, "THREAD_N": 8, "TC_BLOCK_M": 32,
                  "TC_BLOCK_N": 64, "TC_BLOCK_K": 64, "TC_WARP_M": 16, "TC_WARP_N": 32},
    "flash_attention": {"WARPS": 2, "ROWS_PER_WARP": 8},
}
SECOND_CONFIGS = {"triton": TRITON, "cuda": CUDA}


def source(kernel_type: str, backend: str) -> str:
    return starter_path(kernel_type, backend).read_text(encoding="utf-8")
