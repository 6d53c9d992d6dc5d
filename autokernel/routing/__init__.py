"""Routing a model's calls to judged kernels, and everything else to PyTorch.

`autokernel verify` uses this package, and `autokernel export` copies its files verbatim into the
exported kernel package, so the two route the same calls the same way. Hence nothing here imports
anything but torch and the standard library (and each other, relatively).

    router = Router([Winner(target, kernel_type, dims, dtype, kernel_fn, kwargs, route, modules), ...])
    with router.patched(model):
        model(x)
    router.tally.to_json()   # per target: calls served, fallbacks and why; per op: the same

How calls are recognised: see calls.py (ops through a TorchFunctionMode, hand-written forms through
the modules the profile recorded); how they are served: router.py; how outputs compare: outputs.py.
"""
from .calls import DIMS, REFERENCES, Request, label
from .outputs import DTYPE_NAMES, TOLERANCE, dtype_name, error_vs, same_result, tensors_of
from .router import Router, Tally, Winner, load_kernel

__all__ = ["DIMS", "DTYPE_NAMES", "REFERENCES", "Request", "Router", "TOLERANCE", "Tally", "Winner",
           "dtype_name", "error_vs", "label", "load_kernel", "same_result", "tensors_of"]
