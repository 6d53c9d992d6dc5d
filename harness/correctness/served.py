"""A served winner's call watched as a judged call is (verify's child, `export --selftest`, the
exported package, which carries this file with launches.py and integrity.py as its guard/).

`watch(report)` installs the one launch monitor (launches.install), before the first kernel file is
imported, and returns the observer the routing calls every served kernel_fn through: the judge's
op recorder (integrity.ComputeRecorder) around the call, over the same monitor. So what a kernel
sees served is what it saw judged (the same launch wrappers, the same dispatch mode pushed), and
a kernel that finds some other tell and serves PyTorch compute anyway (torch.softmax where it was
judged launching its own kernel) gets the call refused: `report` is told, and the routing raises
KernelRefused (autokernel/deploy/routing/refusals.py), never a quiet fallback. Cost per served
call: pushing and popping the recorder (a few µs) and a Python call per aten op the wrapper
dispatches; nothing per launch, nothing where no winner serves.
"""
from __future__ import annotations

from typing import Callable

# relative: an exported kernel package carries these files as its own guard/
from .integrity import ComputeRecorder
from .launches import install


def watch(report: Callable[[str], None]) -> Callable:
    """Install the launch monitor; returns `observe(kernel_fn, args, kwargs) -> output`."""
    monitor = install()

    def observe(kernel_fn, args, kwargs):
        recorder = ComputeRecorder(monitor)
        with recorder:
            out = kernel_fn(*args, **kwargs)
        if recorder.forbidden:
            # the reference op in disguise, served where it was not judged
            report(f"PyTorch compute inside a served kernel_fn: {recorder.summary()}; a kernel computes in "
                   "its own launches, served as when judged")
        elif recorder.device_to_host:
            report("a served kernel_fn copied device data to the host")
        return out
    return observe
