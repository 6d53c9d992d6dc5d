"""The one launch monitor: the GPU kernels a kernel_fn launches, watched the same way everywhere.

`install()` wraps Triton's launch entry points (compiled and interpreted), the loaders of CUDA C++
extensions built through torch.utils.cpp_extension and the launch method of CUDA C++ kernel files
(harness/cuda_launcher.py) once per process, before the first kernel file is imported, and never
puts them back. The judge's worker, the KernelBench child, verify's child and the exported package
(which carries this file in its guard/) all install it at that point, so what a kernel can see of
it is the same judged and served: `type(kernel).run` is one object from the kernel's import on, and
a kernel that keeps it at import to tell a judged call (once, a wrapper re-made per call) from a
served one has nothing to compare.

The monitor counts launches, so the judge knows how many real kernels a call launched. While a
launch runs, `paused` is true so the integrity recorder does not mistake the interpreter's own
tensor copies for the candidate's compute; inside a Triton launch the pause covers only Triton's
own code (`triton_own_op`): Triton calls the candidate's code back from inside its run() (a grid
callable, a launch hook, a helper an interpreted body calls), and PyTorch compute done there is
the candidate's. While `recording` (the judge, from the first call on), every distinct Triton
specialization launched is kept once (`LaunchRecord`, its tensors replaced by small stand-ins of
the same dtype and alignment), for compile-for-target (harness/compiling/target_compile.py).

Under the Triton interpreter, install() also makes the interpreter run a kernel as a GPU does:
tl.dot computed as tensor cores compute it (TF32 where asked, bf16 emulated:
harness/correctness/interpreter_numerics.py), and the grid routed through the monitor
(harness/correctness/program_order.py): `grid_dims` is each launch's grid (`grids`, while a list,
collects (kernel, programs, seconds, programs that stored anything) of each launch: the verdict's grid, harness/verdict/grid_fill.py),
and where the judge's worker sets `orders`, every launch runs its programs in a secret order, a
checked one in two where its programs share memory; where it sets `unspecified`, an integer division
by zero and a reorderable reshape or cat give the judge's secret answers (harness/correctness/unspecified.py).
A @triton.jit function called from host code (kernel_fn, a grid callable) raises, as Triton's
JITFunction does on a GPU (`_refuse_host_calls`); the interpreter alone would run it on the host.
"""
from __future__ import annotations

import functools
import inspect
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                  "launch_cooperative_grid", "launch_pdl")
# distinct specializations one judgement may launch: a kernel needs a few per shape class; past
# this the judge cannot compile them all for the target, and says so
MAX_SPECIALIZATIONS = 256
ALIGNMENT = 16  # bytes: Triton specializes pointers and integers on divisibility by 16
_perf_counter = time.perf_counter  # bound at import, before any kernel file: the judge's own clock
# the interpreter's builder methods install() replaces (interpreter_numerics.py, program_order.py)
INTERPRETER_HOOKS = ("create_dot", "set_grid_dim", "set_grid_idx", "create_masked_load", "create_masked_store",
                     "create_idiv", "create_srem", "create_urem", "create_shl", "create_lshr", "create_ashr",
                     "create_reshape", "create_cat", "cast_impl",
                     "create_atomic_rmw", "create_atomic_cas")


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


# this file's own folder (harness/correctness/, or an exported package's guard/): the op recorder
# and this monitor, the only code of ours between a dispatched op and the launch it runs in
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def triton_own_op(depth: int = 1) -> bool:
    """Whether the PyTorch op being dispatched (the caller's caller, `depth` frames up, is the
    dispatch mode) was called by Triton's own code rather than by a candidate's callback: the
    nearest Python frame outside torch and this folder must be Triton's."""
    torch_dir, triton_dir = _package_dir("torch"), _package_dir("triton")
    frame = sys._getframe(depth + 1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not (filename.startswith(torch_dir) or filename.startswith(_OWN_DIR)):
            return filename.startswith(triton_dir)
        frame = frame.f_back
    return False


def _signature(raw: Callable) -> tuple[tuple[str, ...], frozenset]:
    """(parameter names, constexpr parameter names) of a kernel's Python function."""
    params, constexprs = [], []
    for p in inspect.signature(raw).parameters.values():
        params.append(p.name)
        ann = p.annotation
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))
        if "constexpr" in str(text):
            constexprs.append(p.name)
    return tuple(params), frozenset(constexprs)


def _constexpr_names(raw: Callable) -> tuple[str, ...]:
    params, constexprs = _signature(raw)
    return tuple(p for p in params if p in constexprs)


def _spec(value, exact: bool):
    """What Triton's launch-time specialization reads of one argument (a constexpr or launch
    option: its value): a tensor's dtype and alignment, an integer's width class, equality to 1
    and divisibility by 16, a float's type. Equal keys compile alike for a GPU."""
    if exact or value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return ("int", value == 1, value % ALIGNMENT == 0, -2**31 <= value < 2**31, value >= 2**63)
    if isinstance(value, float):
        return ("float",)
    dtype, data_ptr = getattr(value, "dtype", None), getattr(value, "data_ptr", None)
    if dtype is not None and callable(data_ptr):
        return ("tensor", dtype, data_ptr() % ALIGNMENT == 0)
    # an object (a TMA descriptor): its plain fields and its tensors' dtypes, never its repr, which
    # would print a tensor it holds (a host read of every value, charged to the candidate's call)
    fields = getattr(value, "__dict__", None) or {}
    return ("object", type(value).__name__,
            tuple(sorted((k, _spec(v, False) if not isinstance(v, (list, tuple)) else tuple(_spec(x, False) for x in v))
                         for k, v in fields.items() if isinstance(k, str))))


def _stand_in(value):
    """A one-element tensor of `value`'s dtype whose address has the same remainder modulo 16 (what
    Triton specializes a pointer on), so a record keeps no candidate tensor alive; anything else as is."""
    import torch
    if not isinstance(value, torch.Tensor):
        return value
    size = max(value.element_size(), 1)
    base = torch.empty(2 * ALIGNMENT // size + 1, dtype=value.dtype)  # the CPU allocator aligns to 64
    offset = (value.data_ptr() % ALIGNMENT) // size
    return base[offset:offset + 1]


class LaunchMonitor:
    """The launches of this process, counted (and while `recording`, kept once per specialization)
    by the wrappers `install()` puts in place once."""

    def __init__(self):
        self.triton_launches = 0
        self.cuda_calls = 0
        self.paused = False
        self.in_triton = 0  # Triton launches running now: inside one, the pause is Triton's own code's
        # kernel name -> the most warps any launch of it asked for: a shape may ask for more threads
        # than a block can hold, which a GPU refuses and the interpreter runs
        self.most_warps: dict[str, int] = {}
        self.recording = False
        self.records: list[LaunchRecord] = []  # every distinct specialization, in launch order
        self.overflow = False  # more than MAX_SPECIALIZATIONS were launched
        self._taken = 0
        self._keys: set = set()
        self._signatures: dict = {}
        self.installed = False
        # the judge's program orders (harness/correctness/program_order.py), set by its worker before
        # the candidate is imported; None elsewhere: the interpreter runs programs in id order
        self.orders = None
        # ... and its answers where a GPU's are unspecified (harness/correctness/unspecified.py)
        self.unspecified = None
        # while `grids` is a list, each interpreted launch appends (kernel name, programs, seconds)
        self.grids: list | None = None
        self.grid_dims: tuple | None = None  # the interpreter's grid of the launch in progress
        # while `grids` is a list: the programs of the launch in progress that stored (or ran an atomic
        # on) at least one element, by their place in the run; programs that return at once do no work
        self.working: set | None = None
        self.program_place: tuple = (0, 0, 0)
        self.kernel_name = "?"  # the Triton kernel of the launch in progress (a finding names it)
        self.tf32_dots = 0  # interpreted dots whose fp32 operands were rounded to TF32, as a GPU rounds them
        # the first launch the interpreter refused (an autotune over several configs: autotuning.py),
        # caught by the candidate or not: it fails every checked call and stage after it
        self.refused: str | None = None

    @property
    def launches(self) -> int:
        return self.triton_launches + self.cuda_calls

    def reset(self) -> None:
        self.triton_launches = self.cuda_calls = 0

    def take_records(self) -> list[LaunchRecord]:
        """The specializations first launched since the last call (compiled for the target once)."""
        new, self._taken = self.records[self._taken:], len(self.records)
        return new

    def _record(self, kernel, args, kwargs) -> None:
        raw = getattr(kernel, "fn", None)
        while hasattr(raw, "fn"):  # autotuner/heuristics wrap the JIT function
            raw = raw.fn
        if raw is None:
            return
        if raw not in self._signatures:
            self._signatures[raw] = _signature(raw)
        params, constexprs = self._signatures[raw]
        key = (raw, tuple(_spec(v, p in constexprs) for p, v in zip(params, args)),
               tuple(sorted((k, _spec(v, k in constexprs or k in LAUNCH_OPTIONS)) for k, v in kwargs.items())))
        try:
            if key in self._keys:
                return
        except TypeError:  # an unhashable constexpr: keyed by its text
            key = repr(key)
            if key in self._keys:
                return
        if len(self._keys) >= MAX_SPECIALIZATIONS:
            self.overflow = True
            return
        self._keys.add(key)
        bound = {p: _stand_in(v) for p, v in zip(params, args)}
        bound.update({k: _stand_in(v) for k, v in kwargs.items() if k in params})
        options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
        self.records.append(LaunchRecord(raw.__name__, raw, bound, tuple(p for p in params if p in constexprs),
                                         None, options))


_MONITOR: list[LaunchMonitor] = []  # the process's one monitor, once installed


def install() -> LaunchMonitor:
    """The process's launch monitor, its wrappers put in place on the first call (before the first
    kernel file is imported) and never undone."""
    if _MONITOR:
        return _MONITOR[0]
    monitor = LaunchMonitor()
    from triton.runtime import jit
    _wrap_run(monitor, jit.JITFunction)
    try:
        from triton.runtime import interpreter
    except ImportError:
        interpreter = None
    if interpreter is not None:
        _wrap_run(monitor, interpreter.InterpretedFunction, interpreted=True)
        _refuse_host_calls(monitor, interpreter.InterpretedFunction)  # tl.cdiv on the host raises on a GPU
        # relative: an exported kernel package carries this file beside launches.py in its guard/
        from . import autotuning, compiler_hints, interpreter_numerics, interpreter_speed, program_order, unspecified
        interpreter_numerics.install(monitor)  # tl.dot and float-to-int conversions as a GPU computes them
        autotuning.install(monitor)  # an autotune over several configs refused: a GPU's pick is unknown here
        interpreter_speed.install()  # without the work whose result it drops
        program_order.install_hooks(monitor)  # the grid seen, and run in the judge's orders
        compiler_hints.install(monitor)  # tl.multiple_of and tl.max_constancy held to their values
        unspecified.install(monitor)  # a division by zero, a reorderable reshape: the judge's answers
    from torch.utils import cpp_extension
    for name in ("load_inline", "load"):
        _wrap_loader(monitor, cpp_extension, name)
    try:  # a CUDA C++ kernel file's launch library (an exported package carries it only for those)
        from harness.cuda_launcher import Launcher
    except ImportError:
        Launcher = None  # noqa: N806
    if Launcher is not None:
        _wrap_invoke(monitor, Launcher)
    monitor.installed = True
    _MONITOR.append(monitor)
    return monitor


def entry_points() -> dict[str, object]:
    """name -> object, for every entry point the installed monitor wrapped: the identity check holds
    them (a candidate that puts an original back launches unseen)."""
    if not _MONITOR:
        return {}
    out = {}
    from triton.runtime import jit
    out["triton.runtime.jit.JITFunction.run"] = jit.JITFunction.run
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is not None:
        out["triton.runtime.interpreter.InterpretedFunction.run"] = interpreter.InterpretedFunction.run
        out["triton.runtime.interpreter.InterpretedFunction.__call__"] = interpreter.InterpretedFunction.__call__
        # the interpreter made to run as a GPU does: its dot, its grid's order, its memory accesses
        for name in INTERPRETER_HOOKS:
            out[f"triton.runtime.interpreter.InterpreterBuilder.{name}"] = getattr(interpreter.InterpreterBuilder, name)
        out["triton.runtime.interpreter.TensorHandle.set_attr"] = interpreter.TensorHandle.set_attr
    from torch.utils import cpp_extension
    out.update({f"torch.utils.cpp_extension.{n}": getattr(cpp_extension, n) for n in ("load_inline", "load")})
    launcher = sys.modules.get("harness.cuda_launcher")
    if launcher is not None:
        out["harness.cuda_launcher.Launcher.invoke"] = launcher.Launcher.invoke
    return out


def _wrap_run(monitor: LaunchMonitor, cls: type, interpreted: bool = False) -> None:
    original = cls.run

    @functools.wraps(original)
    def run(kernel, *args, grid=None, warmup=False, **kwargs):
        if warmup:
            return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
        monitor.triton_launches += 1
        warps = kwargs.get("num_warps")
        if isinstance(warps, int) and warps > monitor.most_warps.get(getattr(kernel, "__name__", "?"), 0):
            monitor.most_warps[getattr(kernel, "__name__", "?")] = warps
        if monitor.recording:
            monitor._record(kernel, args, kwargs)
        was = monitor.paused
        monitor.paused = True
        monitor.in_triton += 1
        # the enclosing launch's grid comes back at the end: a launch made from a grid callable
        # (host code) must not leave that callable looking like a running program's code
        start, outer_dims, monitor.grid_dims = _perf_counter(), monitor.grid_dims, None
        monitor.kernel_name = getattr(kernel, "__name__", "?")
        monitor.working = set() if monitor.grids is not None else None
        try:
            if interpreted and monitor.orders is not None:
                return monitor.orders.run(lambda: original(kernel, *args, grid=grid, warmup=warmup, **kwargs),
                                          kernel, args, kwargs)
            return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            monitor.in_triton -= 1
            monitor.paused = was
            if monitor.grids is not None and monitor.grid_dims is not None:
                monitor.grids.append((getattr(kernel, "__name__", "?"), math.prod(monitor.grid_dims),
                                      _perf_counter() - start, len(monitor.working or ())))
            monitor.working = None
            monitor.grid_dims = outer_dims

    cls.run = run


HOST_CALL = "Cannot call @triton.jit'd outside of the scope of a kernel"


def _refuse_host_calls(monitor: LaunchMonitor, cls: type) -> None:
    """A @triton.jit function called from host code (kernel_fn, a grid callable, a launch hook: before
    a launch's programs run) raises on a GPU, where Triton's JITFunction refuses it; the interpreter
    ran it on the host, so `tl.cdiv(n, BLOCK)` in a kernel_fn passed here and failed there. It raises
    here too, with Triton's words; called from a launch's programs it is a device function, as before."""
    original = cls.__call__
    if getattr(original, "host_calls_refused", False):
        return

    def __call__(self, *args, **kwargs):
        if not monitor.in_triton or monitor.grid_dims is None:  # no launch, or its programs not started
            raise RuntimeError(f"{HOST_CALL} (on the host, call {getattr(self, '__name__', 'it')}'s plain Python "
                               "counterpart, e.g. triton.cdiv for tl.cdiv)")
        return original(self, *args, **kwargs)

    __call__.host_calls_refused, __call__.__wrapped__ = True, original
    cls.__call__ = __call__


def _wrap_loader(monitor: LaunchMonitor, module, name: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def load(*args, **kwargs):
        return _CountingModule(original(*args, **kwargs), monitor)

    setattr(module, name, load)


def _wrap_invoke(monitor: LaunchMonitor, launcher: type) -> None:
    original = launcher.invoke

    @functools.wraps(original)
    def invoke(self, name, values):
        monitor.cuda_calls += 1
        was = monitor.paused
        monitor.paused = True
        try:
            return original(self, name, values)
        finally:
            monitor.paused = was

    launcher.invoke = invoke


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
