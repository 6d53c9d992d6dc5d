"""What a kernel_fn may do with PyTorch, observed rather than trusted.

`ComputeRecorder` is a TorchDispatchMode that sees every aten op the candidate's Python code (or a
C++ extension it calls) dispatches, outside the kernel launches themselves. Allocation, views,
copies and casts are allowed: a wrapper needs them to lay out inputs and outputs. Anything else is
compute done by PyTorch, which is the reference op in disguise (a "softmax kernel" that calls
torch.softmax) or a partial PyTorch implementation the kernel did not earn.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# relative: an exported kernel package carries this file and launches.py as its own guard/
from .launches import LaunchMonitor, triton_own_op

# Ops a wrapper may use: allocate, view, reshape, lay out, copy, cast, query.
ALLOWED_OPS = frozenset({
    # allocation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "full", "full_like", "new_full", "ones", "ones_like", "new_ones", "fill", "fill_",
    "zero", "zero_", "scalar_tensor", "arange", "lift_fresh", "lift_fresh_copy",
    # views and layout
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t", "transpose", "permute",
    "expand", "squeeze", "unsqueeze", "select", "slice", "split", "split_with_sizes", "chunk",
    "unbind", "narrow", "flatten", "unflatten", "view_as", "alias", "detach", "contiguous",
    "movedim", "numpy_T", "expand_as", "diagonal",
    # copies and casts
    "clone", "copy", "copy_", "_to_copy", "to", "_copy_from", "_copy_from_and_resize", "resize_",
    # queries
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "stride", "size",
    "dim", "numel", "is_same_size", "_local_scalar_dense", "item", "set_",
})
# A scalar read of a tensor's data (float(t), t.item(), bool(t), iteration turned into numbers):
# the values leave the device for Python, where the call can compute out of sight of its kernels.
HOST_READS = frozenset({"_local_scalar_dense", "item"})


# Tensor methods that turn values into text. torch runs a tensor's repr under
# _disable_current_modes, so the recorder never sees the scalar reads inside it: while a recorder
# records, a call of one counts as a host read itself (f"{t}", "%r" % t, "{!r}".format(t)).
TEXT_METHODS = ("__repr__", "__format__")
_RECORDING: list["ComputeRecorder"] = []  # the recorder of the call in progress, innermost last


def watch_text_reads() -> None:
    """Wrap torch.Tensor's text methods, once, before any candidate is imported: the worker's
    identity check then holds the wrappers as the originals (harness/isolation/tamper.py)."""
    for name in TEXT_METHODS:
        original = getattr(torch.Tensor, name)
        if getattr(original, "counts_host_reads", False):
            continue

        def read_as_text(self, *args, _original=original, _name=name):
            reads = _RECORDING[-1].host_reads if _RECORDING and _RECORDING[-1].counting() else None
            if reads is not None and f"Tensor.{_name}" not in reads:  # once: a repr formats every element
                reads.append(f"Tensor.{_name}")
            return _original(self, *args)
        read_as_text.counts_host_reads = True
        setattr(torch.Tensor, name, read_as_text)


def op_base_name(func) -> str:
    """aten.add_.Tensor -> add_; aten._to_copy.default -> _to_copy."""
    name = getattr(func, "__name__", None) or str(func)  # e.g. "add_.Tensor"; str() only when it has none
    return name.split(".")[0]


def is_allowed(func) -> bool:
    return _allowed_name(op_base_name(func))


def _allowed_name(name: str) -> bool:
    if name in ALLOWED_OPS:
        return True
    return name.endswith("_") and name[:-1] in ALLOWED_OPS


class ComputeRecorder(TorchDispatchMode):
    """Records aten compute ops run outside kernel launches (while the monitor is not paused)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # the default wraps __torch_dispatch__ for dynamo, importing torch._dynamo in every judge
        # child (over a second of start-up); this mode never runs under torch.compile
        return False

    def __init__(self, monitor: LaunchMonitor | None = None, allocations=None):
        super().__init__()
        self.monitor = monitor
        # a judged call's guard on what kernel_fn allocates (harness/correctness/guards.py's
        # Allocations): each new storage is moved between guard bytes as it is made
        self.allocations = allocations
        self.forbidden: list[str] = []
        self.device_to_host = 0
        self.host_reads: list[str] = []

    def __enter__(self):
        _RECORDING.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        if _RECORDING and _RECORDING[-1] is self:
            _RECORDING.pop()
        return super().__exit__(*exc)

    def counting(self) -> bool:
        """Whether the candidate's own Python runs now (not a kernel launch the monitor pauses for)."""
        return self.monitor is None or not self.monitor.paused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # the candidate's op: outside a launch, or inside one but called back from the candidate's
        # code (a grid callable, a launch hook), not Triton's own; what it allocates there is guarded
        # and filled as anywhere else
        mine = self.monitor is None or not self.monitor.paused or (self.monitor.in_triton and not triton_own_op(0))
        if self.allocations is not None and mine:
            return self.allocations.adopt(op_base_name(func), self._record(func, args, kwargs, mine))
        return self._record(func, args, kwargs, mine)

    def _record(self, func, args, kwargs, mine: bool):
        if mine:
            # every timed call runs under this mode too: one name lookup per op keeps it to a few µs
            name = op_base_name(func)
            if name in HOST_READS:
                self.host_reads.append(f"aten::{name}")
            elif not _allowed_name(name):
                self.forbidden.append(f"aten::{name}")
            elif name in ("_to_copy", "copy_", "_copy_from") and _leaves_device(args, kwargs):
                # a GPU kernel that copies its input to the host can compute it there, unseen
                self.device_to_host += 1
        return func(*args, **kwargs)

    def summary(self) -> str:
        seen = sorted(set(self.forbidden))
        return ", ".join(seen[:8]) + (" ..." if len(seen) > 8 else "")


def observation_problem(label: str, obs: dict, device: str) -> str | None:
    """What one call's observations break of the integrity rules, or None (checked and timed alike)."""
    if obs.get("host_reads"):
        # every element read with float(t) and recomputed in Python: compute on the host
        return (f"{label}: host compute: kernel_fn read a tensor's values into Python "
                f"({', '.join(obs['host_reads'][:3])}); compute in the kernels it launches")
    if obs.get("forbidden"):
        # the reference op in disguise: a "kernel" whose work is done by PyTorch
        return (f"{label}: PyTorch compute inside kernel_fn: {', '.join(obs['forbidden'][:6])}; "
                "only allocation, views, copies and casts are allowed outside Triton/CUDA kernels")
    if obs.get("device_to_host"):
        # computing on the host behind a GPU kernel's back
        return f"{label}: kernel_fn copied device data to the host"
    if obs.get("program_order"):
        # programs that read what others of their launch wrote: right in the interpreter's id order only
        return f"{label}: {obs['program_order'][0]}"
    if obs.get("launches", 0) < 1:
        # no kernel at all: the answer came from somewhere else
        return f"{label}: no Triton or CUDA kernel was launched"
    if obs.get("mutated"):
        # in-place writes into inputs corrupt the caller's tensors
        return f"{label}: kernel_fn modified its input(s) {obs['mutated']} in place"
    outside = next((w for w in obs.get("writes") or () if w.get("outside")), None)
    if outside:
        # a store past a row of a view: in a model, the k beside a q sliced from one projection
        first = outside.get("first") or {}
        return (f"{label}: kernel_fn wrote outside the elements of its input {outside.get('name')}: "
                f"{outside['outside']} byte(s), the first at byte offset {first.get('offset')} from its first "
                f"element, {first.get('where')}")
    if obs.get("strays"):
        # a store past the output (or scratch) kernel_fn allocated: on a GPU, another tensor's memory
        s = obs["strays"][0]
        return (f"{label}: kernel_fn wrote {s.get('where')} of {s.get('tensor')}: {s.get('bytes')} byte(s) of "
                f"the judge's guard changed, the first at byte offset {s.get('offset')} of a storage of "
                f"{s.get('size')} bytes")
    if obs.get("aliased"):
        # an output sharing an input's storage changes when the caller reuses that input
        return f"{label}: the output shares storage with an input"
    if obs.get("borrowed"):
        # bytes past the output that no reference checks (a stash a backward reads back) and that a
        # served call, whose output autograd or a caller may copy, does not carry
        return (f"{label}: the output does not own its storage: it is {obs['borrowed']}; return the tensor "
                "you allocated (or a view of all of it), with nothing else in its storage")
    if not obs.get("plain", True):
        # a Tensor subclass or lazy object can fake values when inspected
        return f"{label}: the output is not a plain dense torch.Tensor"
    if obs.get("device") and not obs["device"].startswith(device):
        return f"{label}: the output is on {obs['device']}, not on {device}"
    return None


def _leaves_device(args, kwargs) -> bool:
    src = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if src is None or src.device.type == "cpu":
        return False
    dst = kwargs.get("device")
    if dst is not None:
        return torch.device(dst).type == "cpu"
    others = [a for a in args[1:] if isinstance(a, torch.Tensor)]
    return any(o.device.type == "cpu" for o in others) or (
        len(args) > 1 and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu")
