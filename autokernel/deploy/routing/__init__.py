"""Plugging judged kernels into a model, and everything else left to PyTorch.

`autokernel verify` uses this package, and `autokernel export` copies its files verbatim into the
exported kernel package, so the two serve the same calls the same way. Hence nothing here imports
anything but torch, triton (bias.py, when a biased nn.Linear is served) and the standard library.

    router = Router([Winner(target, kernel_type, dims, dtype, kernel_fn, kwargs, route, modules), ...])
    with router.patched(model):
        model(x)
    router.tally.to_json()   # per target: calls served, fallbacks and why; per op: the same

What a call of each kernel type looks like: calls.py. Which calls a winner may serve (its serving
range) and why any other falls back: serving.py. What is replaced in a model at patch time:
binding.py. The stand-ins and their guards: sites.py. Serving and counting: router.py. Each winner
as a torch custom op, for torch.compile: ops.py. How outputs compare: outputs.py.
"""
from .calls import DIMS, REFERENCES, Request, label
from .outputs import DTYPE_NAMES, TOLERANCE, dtype_name, error_vs, same_result, tensors_of
from .refusals import KernelRefused
from .router import Router, SurfaceRefused, Tally, Winner, load_kernel
from .serving import FREE_DIMS, ServingRange

__all__ = ["DIMS", "DTYPE_NAMES", "FREE_DIMS", "KernelRefused", "REFERENCES", "Request", "Router", "ServingRange", "TOLERANCE",
           "SurfaceRefused", "Tally", "Winner", "dtype_name", "error_vs", "label", "load_kernel", "same_result", "tensors_of"]
