"""Watch the GPU kernels a kernel_fn launches.

`LaunchMonitor` patches Triton's launch entry points (compiled and interpreted), the launch
libraries of CUDA C++ kernel files (harness/cuda_launcher.py) and wraps the functions of CUDA C++
extensions built through torch.utils.cpp_extension, so the judge knows how
many real kernels a call launched and, for compile-for-target, with which arguments, constexprs and
launch options. While a launch runs, `paused` is true so the integrity recorder does not mistake
the interpreter's own tensor copies for the candidate's compute; inside a Triton launch the pause
covers only Triton's own code (`triton_own_op`): Triton calls the candidate's code back from inside
its run() (a grid callable, a launch hook, a helper an interpreted body calls), and PyTorch compute
done there is the candidate's.
"""
from __future__ import annotations

import functools
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                  "launch_cooperative_grid", "launch_pdl")


@dataclass
class LaunchRecord:
    """One Triton launch: enough to compile the same specialization for another target."""

    name: str
    fn: Callable  # the undecorated Python function of the @triton.jit kernel
    args: dict[str, Any]  # every parameter by name, as passed (tensors, ints, floats, constexprs)
    constexprs: tuple[str, ...]
    grid: Any
    options: dict[str, Any] = field(default_factory=dict)


@functools.lru_cache(maxsize=None)
def _package_dir(name: str) -> str:
    module = sys.modules.get(name) or __import__(name)
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


def triton_own_op(depth: int = 1) -> bool:
    """Whether the PyTorch op being dispatched (the caller's caller, `depth` frames up, is the
    dispatch mode) was called by Triton's own code rather than by a candidate's callback: the
    nearest Python frame outside torch and this harness must be Triton's."""
    torch_dir, triton_dir = _package_dir("torch"), _package_dir("triton")
    harness_dir = _package_dir("harness")
    frame = sys._getframe(depth + 1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not (filename.startswith(torch_dir) or filename.startswith(harness_dir)):
            return filename.startswith(triton_dir)
        frame = frame.f_back
    return False


def _constexpr_names(raw: Callable) -> tuple[str, ...]:
    names = []
    for p in inspect.signature(raw).parameters.values():
        ann = p.annotation
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))
        if "constexpr" in str(text):
            names.append(p.name)
    return tuple(names)


class LaunchMonitor:
    """Context manager: counts (and optionally records) kernel launches while active."""

    def __init__(self, record: bool = False):
        self.record = record
        self.triton_launches = 0
        self.cuda_calls = 0
        self.records: list[LaunchRecord] = []
        self.paused = False
        self.in_triton = 0  # Triton launches running now: inside one, the pause is Triton's own code's
        # kernel name -> the most warps any launch of it asked for: only the first call's launches are
        # compiled for the target, and a later shape may ask for more threads than a block can hold
        self.most_warps: dict[str, int] = {}
        self._undo: list[Callable[[], None]] = []

    @property
    def launches(self) -> int:
        return self.triton_launches + self.cuda_calls

    def reset(self) -> None:
        self.triton_launches = self.cuda_calls = 0
        self.records = []

    # -- Triton ------------------------------------------------------------------------------
    def _wrap_run(self, cls: type) -> None:
        original = cls.run
        monitor = self

        @functools.wraps(original)
        def run(kernel, *args, grid=None, warmup=False, **kwargs):
            if warmup:
                return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            monitor.triton_launches += 1
            warps = kwargs.get("num_warps")
            if isinstance(warps, int) and warps > monitor.most_warps.get(getattr(kernel, "__name__", "?"), 0):
                monitor.most_warps[getattr(kernel, "__name__", "?")] = warps
            if monitor.record:
                monitor._record(kernel, args, kwargs, grid)
            was = monitor.paused
            monitor.paused = True
            monitor.in_triton += 1
            try:
                return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                monitor.in_triton -= 1
                monitor.paused = was

        cls.run = run
        self._undo.append(lambda: setattr(cls, "run", original))

    def _record(self, kernel, args, kwargs, grid) -> None:
        raw = getattr(kernel, "fn", None)
        while hasattr(raw, "fn"):  # autotuner/heuristics wrap the JIT function
            raw = raw.fn
        if raw is None:
            return
        params = list(inspect.signature(raw).parameters)
        bound = dict(zip(params, args))
        bound.update({k: v for k, v in kwargs.items() if k in params})
        options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
        self.records.append(LaunchRecord(raw.__name__, raw, bound, _constexpr_names(raw), grid, options))

    # -- CUDA C++ extensions -----------------------------------------------------------------
    def _wrap_loader(self, module, name: str) -> None:
        original = getattr(module, name)
        monitor = self

        @functools.wraps(original)
        def load(*args, **kwargs):
            return _CountingModule(original(*args, **kwargs), monitor)

        setattr(module, name, load)
        self._undo.append(lambda: setattr(module, name, original))

    def _wrap_invoke(self) -> None:
        from harness.cuda_launcher import Launcher
        original = Launcher.invoke
        monitor = self

        @functools.wraps(original)
        def invoke(launcher, name, values):
            monitor.cuda_calls += 1
            was = monitor.paused
            monitor.paused = True
            try:
                return original(launcher, name, values)
            finally:
                monitor.paused = was

        Launcher.invoke = invoke
        self._undo.append(lambda: setattr(Launcher, "invoke", original))

    def __enter__(self) -> "LaunchMonitor":
        from triton.runtime import jit
        self._wrap_run(jit.JITFunction)
        try:
            from triton.runtime import interpreter
            self._wrap_run(interpreter.InterpretedFunction)
        except ImportError:
            pass
        from torch.utils import cpp_extension
        for name in ("load_inline", "load"):
            self._wrap_loader(cpp_extension, name)
        self._wrap_invoke()
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()


class _CountingModule:
    """A built extension whose every function call counts as a launch."""

    def __init__(self, module, monitor: LaunchMonitor):
        self._module = module
        self._monitor = monitor

    def __getattr__(self, name: str):
        attr = getattr(self._module, name)
        if not callable(attr):
            return attr
        monitor = self._monitor

        @functools.wraps(attr)
        def call(*args, **kwargs):
            monitor.cuda_calls += 1
            was = monitor.paused
            monitor.paused = True
            try:
                return attr(*args, **kwargs)
            finally:
                monitor.paused = was
        return call
