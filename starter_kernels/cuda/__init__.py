"""CUDA C++ starter kernels, one module per kernel type, each a kernel file with BACKEND = "cuda".

The contract of a CUDA C++ kernel file (the full text is in harness/cuda_build.py):

    import torch
    from harness.cuda_launcher import dtype_code, load_launcher

    KERNEL_TYPE = "softmax"
    BACKEND = "cuda"
    TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}   # optional, as for Triton starters
    CONSTRAINTS = ["THREADS % 32 == 0"]                  # optional
    CONFIG = {"THREADS": 256}                            # every value becomes `#define THREADS 256`
    CUDA_KERNELS = r'''...'''   # __global__ kernels + plain C++ `*_launch` functions (raw pointers,
                                # sizes, a dtype code, cudaStream_t); CUDA headers only

    def kernel_fn(x):           # the host side in Python: checks, .contiguous(), allocation
        x = x.contiguous()
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        rows, cols = x.numel() // x.shape[-1], x.shape[-1]
        load_launcher(CUDA_KERNELS, CONFIG).softmax_launch(x, y, rows, cols, dtype_code(x), None)
        return y

The judge's compile stage compiles CUDA_KERNELS with its CONFIG macros for the target architecture
with nvcc (no GPU needed, about a second) and reports registers, spills and shared memory per
kernel; on a GPU, `load_launcher` builds the same text with nvcc alone into a small shared library
(about three seconds, no torch headers, once per source and config, cached on disk) and launches
through ctypes (harness/cuda_launcher.py). So what is checked is exactly what runs.

Conventions the starters follow:
- They include the header cuda_build provides, "autokernel_cuda.cuh", in CUDA_KERNELS (dtype
  codes, to_float / from_float<T>, AUTOKERNEL_DISPATCH, warp reductions).
- One launcher per operation takes a dtype code (DTYPE_F32 / F16 / BF16) and instantiates the
  kernel template for float, __half and __nv_bfloat16, so every instantiation is compiled (and
  reported) by the compile stage. No fp16 round trip for fp32 inputs.
- Statistics, sums and dot products accumulate in fp32; outputs are rounded once, at the store.
- Reductions use a fixed order (warp shuffles, then one warp over the warps' partials), never
  atomics, so results are bitwise reproducible.
- Every CONFIG the CONSTRAINTS admit is correct for every shape; constraints only keep a
  configuration within the hardware (threads per block, 48 KiB of static shared memory).
"""
