"""CUDA C++ starter kernels, one module per kernel type, each a kernel file with BACKEND = "cuda".

The contract of a CUDA C++ kernel file (the full text is in harness/cuda_build.py):

    KERNEL_TYPE = "softmax"
    BACKEND = "cuda"
    TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}   # optional, as for Triton starters
    CONSTRAINTS = ["THREADS % 32 == 0"]                  # optional
    CONFIG = {"THREADS": 256}                            # every value becomes `#define THREADS 256`
    CUDA_KERNELS = r'''...'''   # __global__ kernels + plain C++ launchers (raw pointers, sizes,
                                # cudaStream_t); CUDA headers only, no torch headers
    CUDA_HOST = r'''...'''      # #include <torch/extension.h>: checks, .contiguous(), allocation,
                                # the launcher call on at::cuda::getCurrentCUDAStream()
    FUNCTIONS = ["softmax_fwd"] # the CUDA_HOST functions Python calls

    def kernel_fn(x):
        return load_cuda(KERNEL_TYPE, CUDA_KERNELS, CUDA_HOST, FUNCTIONS, CONFIG).softmax_fwd(x)

The judge's compile stage compiles CUDA_KERNELS with its CONFIG macros for the target architecture
with nvcc (no GPU needed, about a second) and reports registers, spills and shared memory per
kernel; on a GPU, `load_cuda` builds CUDA_KERNELS + CUDA_HOST as one extension, once per source and
config, cached on disk. So what is checked is exactly what runs.

Conventions the starters follow:
- They include the two optional headers cuda_build provides: "autokernel_cuda.cuh" in
  CUDA_KERNELS (dtype codes, to_float / from_float<T>, AUTOKERNEL_DISPATCH) and
  "autokernel_torch.h" in CUDA_HOST (dtype_code(tensor, "op")).
- One launcher per operation takes a dtype code (DTYPE_F32 / F16 / BF16) and instantiates the
  kernel template for float, __half and __nv_bfloat16, so every instantiation is compiled (and
  reported) by the compile stage. No fp16 round trip for fp32 inputs.
- Statistics, sums and dot products accumulate in fp32; outputs are rounded once, at the store.
- Reductions use a fixed order (warp shuffles, then one warp over the warps' partials), never
  atomics, so results are bitwise reproducible.
- Every CONFIG the CONSTRAINTS admit is correct for every shape; constraints only keep a
  configuration within the hardware (threads per block, 48 KiB of static shared memory).
"""
