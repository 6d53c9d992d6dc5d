"""Attacks on the timing that only a GPU can run (tests/attacks/test_gpu_timing.py, marked gpu).

Each is right on the checked calls of the judge's stages; at the target shape, after its first
call there (the check the shape sweep makes), it tries to win the timed calls:

- graph_replay: captures the honest launch in a CUDA graph on its first call and from then on
  replays it: the graph reads the buffer it captured, so every later call returns the recorded answer.
- allocator_block: launches a kernel that writes nothing and returns torch.empty_like's block, which
  the caching allocator hands back still holding the answer of a call made earlier in the process.
- side_stream: launches its work on a side stream the timed region's events never wait for (fifty
  times over, so the hidden time is well above the witness's slack), so the work finishes after
  the region has ended.
- cuda_eager_when_timed, cuda_remembers_inputs: the unwatched-call and the remembered-input classes
  in CUDA C++ (harness/cuda_launcher.py): PyTorch's softmax once the calls outnumber the checks,
  and a kernel that keys a remembered answer by the signs of two input elements, all on the device.
"""
from __future__ import annotations

import re

from judge_kernels import LAUNCH, WRAPPER, source
from starter_kernels import starter_path

TARGET_ROWS, TARGET_COLS = 512, 1024
_AT_TARGET = f"tuple(x.shape) == ({TARGET_ROWS}, {TARGET_COLS})"
_COUNTED = (f"    if {_AT_TARGET}:\n"
            "        _cache['target'] = _cache.get('target', 0) + 1\n"
            "    if _cache.get('target', 0) > 1 and {at}:\n").format(at=_AT_TARGET)

GRAPH_REPLAY = WRAPPER.replace(
    "    y = torch.empty_like(x2)\n",
    "    y = torch.empty_like(x2)\n" + _COUNTED +
    "        graph, answer = _cache['graph']\n"
    "        graph.replay()\n"
    "        return answer.clone().view(shape)\n", 1).replace(
    "    return y.view(shape)",
    f"    if {_AT_TARGET} and 'graph' not in _cache:\n"
    "        recorded, answer = x2.clone(), torch.empty_like(x2)\n"
    "        graph = torch.cuda.CUDAGraph()\n"
    "        with torch.cuda.graph(graph):\n"
    "            _softmax_row[(x2.shape[0],)](recorded, answer, x2.shape[1], x2.stride(0), answer.stride(0), 0.0,\n"
    "                                         BLOCK=triton.next_power_of_2(x2.shape[1]))\n"
    "        _cache['graph'] = (graph, answer)\n"
    "    return y.view(shape)", 1)

ALLOCATOR_BLOCK = WRAPPER.replace(
    "    y = torch.empty_like(x2)\n",
    "    y = torch.empty_like(x2)\n" + _COUNTED +
    "        _softmax_row[(x2.shape[0],)](x2, y, 0, x2.stride(0), y.stride(0), 0.0, BLOCK=1)\n"
    "        return y.view(shape)\n", 1)

SIDE_STREAM = WRAPPER.replace(
    "    y = torch.empty_like(x2)\n",
    "    y = torch.empty_like(x2)\n" + _COUNTED +
    "        side = _cache.setdefault('side', torch.cuda.Stream())\n"
    "        side.wait_stream(torch.cuda.current_stream())\n"
    "        with torch.cuda.stream(side):\n"
    "            for _ in range(50):\n"
    + "\n".join("            " + line for line in LAUNCH.split("\n")) + "\n"
    "        return y.view(shape)\n", 1)

CUDA_EAGER_WHEN_TIMED = '''

def kernel_fn(x):
    if tuple(x.shape) == ({rows}, {cols}):
        _cache["target"] = _cache.get("target", 0) + 1
        if _cache["target"] > 1:
            return torch.softmax(x, -1)
    return _honest(x)
'''.format(rows=TARGET_ROWS, cols=TARGET_COLS)

REMEMBER_CUDA = r'''
template <typename T>
__global__ void __launch_bounds__(THREADS) remember_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                           const int* __restrict__ seen, T* __restrict__ memory,
                                                           int64_t cols, int64_t numel) {
  const int key = (to_float(x[0]) > 0.f ? 1 : 0) + (to_float(x[1]) > 0.f ? 2 : 0);
  T* slot = memory + key * numel + (int64_t)blockIdx.x * cols;
  const T* x_row = x + (int64_t)blockIdx.x * cols;
  T* y_row = y + (int64_t)blockIdx.x * cols;
  if (seen[key]) {  // the same for every thread of the block: no barrier is skipped by some only
    for (int64_t c = threadIdx.x; c < cols; c += THREADS) y_row[c] = slot[c];
    return;
  }
  MaxSum part = {-FLT_MAX, 0.f};
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    const float v = to_float(x_row[c]);
    if (v > part.m) {
      part.s = part.s * expf(part.m - v) + 1.f;
      part.m = v;
    } else {
      part.s += expf(v - part.m);
    }
  }
  const MaxSum row = block_merge(part);
  const float inv_sum = 1.f / row.s;
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    const T out = from_float<T>(expf(to_float(x_row[c]) - row.m) * inv_sum);
    y_row[c] = out;
    slot[c] = out;
  }
}

template <typename T>
__global__ void mark_kernel(const T* __restrict__ x, int* __restrict__ seen) {
  seen[(to_float(x[0]) > 0.f ? 1 : 0) + (to_float(x[1]) > 0.f ? 2 : 0)] = 1;
}

template <typename T>
static void launch_remember(const void* x, void* y, void* seen, void* memory, int64_t rows, int64_t cols,
                            cudaStream_t stream) {
  remember_kernel<T><<<(unsigned)rows, THREADS, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                             static_cast<const int*>(seen), static_cast<T*>(memory),
                                                             cols, rows * cols);
  mark_kernel<T><<<1, 1, 0, stream>>>(static_cast<const T*>(x), static_cast<int*>(seen));
}

void remember_launch(const void* x, void* y, void* seen, void* memory, int64_t rows, int64_t cols, int dtype,
                     cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch_remember<T>(x, y, seen, memory, rows, cols, stream));
}
'''

CUDA_REMEMBERS_INPUTS = '''

def kernel_fn(x):
    if tuple(x.shape) != ({rows}, {cols}):
        return _honest(x)
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if "memory" not in _cache:
        _cache["seen"] = torch.zeros(4, dtype=torch.int32, device=x.device)
        _cache["memory"] = torch.empty(4 * x.numel(), dtype=x.dtype, device=x.device)
    load_launcher(CUDA_KERNELS, CONFIG).remember_launch(x, y, _cache["seen"], _cache["memory"], x.shape[0],
                                                        x.shape[1], dtype_code(x), None)
    return y
'''.format(rows=TARGET_ROWS, cols=TARGET_COLS)


def _cuda_starter_with(kernel_fn: str, extra_cuda: str = "") -> str:
    """The CUDA C++ softmax starter, its kernel_fn renamed _honest, with `kernel_fn` after it."""
    text = starter_path("softmax", "cuda").read_text(encoding="utf-8")
    text = re.sub(r"^def kernel_fn\(x\):", "def _honest(x):", text, count=1, flags=re.M)
    if extra_cuda:
        text = text.replace("// x and y contiguous [rows, cols]", extra_cuda + "\n// x and y contiguous [rows, cols]", 1)
    return text.replace('BACKEND = "cuda"\n', 'BACKEND = "cuda"\n_cache = {}\n', 1) + kernel_fn


def sources() -> dict[str, str]:
    """name -> kernel file text."""
    return {
        "graph_replay": source(wrapper=GRAPH_REPLAY),
        "allocator_block": source(wrapper=ALLOCATOR_BLOCK),
        "side_stream": source(wrapper=SIDE_STREAM),
        "cuda_eager_when_timed": _cuda_starter_with(CUDA_EAGER_WHEN_TIMED),
        "cuda_remembers_inputs": _cuda_starter_with(CUDA_REMEMBERS_INPUTS, REMEMBER_CUDA),
    }
