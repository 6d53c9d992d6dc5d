"""The identity check of the judge's clocks, sync points and own functions (child side).

A candidate shares the worker's process: at import it can rebind time.perf_counter to a clock that
hides its own time, replace torch.cuda.Event, or swap one of the judge's functions for one that
always agrees. The static check refuses the plain ways to write that; an attribute chain through an
allowed module still reaches them at run time. So the worker snapshots, before the candidate is
imported, every object it relies on (the objects themselves, kept alive so an id cannot be reused),
and compares them by identity after the import and after every stage and the timing.
"""
from __future__ import annotations

import _thread
import dataclasses
import sys
import time
import types

# Clocks and sync points a timing reads; a replaced one fakes the time.
CLOCK_NAMES = ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
               "process_time", "sleep")
CUDA_NAMES = ("Event", "synchronize", "current_stream", "default_stream", "Stream", "stream",
              "set_stream", "Event.record", "Event.elapsed_time", "Event.synchronize", "Event.query",
              "Event.wait", "Stream.synchronize", "Stream.wait_event", "Stream.record_event")
# The judge's own modules: every global they hold (functions, imported modules and names).
# harness.cuda_launcher is the host side of CUDA C++ candidates: its launch check and the method the
# LaunchMonitor counts through. harness.kernelbench.kb_protocol is the KernelBench child's seeding, inputs and
# timing (a module not imported, as in the kernel worker, is skipped). harness.timing.timed_calls,
# harness.timing.fresh_inputs and harness.timing.spread watch, refill and re-time the timed calls;
# harness.timing.timed_outputs, harness.timing.device_check and harness.kernel_types.references choose,
# checksum and compare their outputs on the device.
JUDGE_MODULES = ("harness.timing.timer", "harness.correctness.compare", "harness.correctness.candidate", "harness.correctness.launches",
                 "harness.correctness.integrity", "harness.kernel_types.registry", "harness.correctness.cases", "harness.isolation.tamper",
                 "harness.cuda_launcher", "harness.kernelbench.kb_protocol", "harness.timing.measurement", "harness.timing.witness",
                 "harness.isolation.audit_hook", "harness.timing.timed_calls", "harness.timing.fresh_inputs", "harness.timing.spread",
                 "harness.timing.timed_outputs", "harness.timing.device_check", "harness.kernel_types.references",
                 "statistics", "json")


CODE_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


def _resolve(root, dotted: str):
    obj = root
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# The clocks the timing loop itself reads, bound in harness/timing/timer.py before the import: checked
# after every call of the candidate, since a clock swapped for one call may put itself back when
# first read, long before the check between stages.
TIMING_CLOCKS = ("_clock", "_Event", "_record", "_elapsed_ms", "_synchronize")


def clocks() -> dict[str, object]:
    """name -> object, for every clock and sync point: cheap enough to check after each call."""
    import torch
    out: dict[str, object] = {f"time.{n}": getattr(time, n) for n in CLOCK_NAMES}
    for name in CUDA_NAMES:
        obj = _resolve(torch.cuda, name)
        if obj is not None:
            out[f"torch.cuda.{name}"] = obj
    out["torch.cuda"] = torch.cuda
    timing = sys.modules.get("harness.timing.timer")
    for name in TIMING_CLOCKS if timing is not None else ():
        out[f"harness.timing.timer.{name}"] = getattr(timing, name, None)
    return out


def watched(extra_modules: tuple[str, ...] = ()) -> dict[str, object]:
    """name -> object, for everything whose identity must not change."""
    out = clocks()
    for mod_name in JUDGE_MODULES + extra_modules:
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        out[f"sys.modules[{mod_name!r}]"] = mod
        for key, value in list(vars(mod).items()):
            if key.startswith("__") or not isinstance(value, CODE_TYPES):
                continue  # data (caches, counters) may change; code and modules may not
            out[f"{mod_name}.{key}"] = value
            if isinstance(value, type) and value.__module__ == mod_name:
                # methods of the judge's classes: LaunchMonitor.__enter__, Log.event, ...
                for attr, member in list(vars(value).items()):
                    if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                        out[f"{mod_name}.{key}.{attr}"] = member
    out.update(kernel_types())
    monitor = sys.modules.get("harness.correctness.launches")
    if monitor is not None:
        # the launch monitor's wrappers, installed once: an original put back launches unseen
        out.update(monitor.entry_points())
    out.update(tensor_methods())
    return out


def tensor_methods() -> dict[str, object]:
    """name -> object, for every method and descriptor of torch.Tensor and its C base: one replaced
    at import (`TensorClass.detach = ...`) runs the candidate's code inside the judge's own calls,
    after the timed region (the judge saving an output), or switches off the L2 flush (`zero_`)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    out = {}
    for owner, cls in (("torch.Tensor", torch.Tensor), ("torch._C.TensorBase", torch._C.TensorBase)):
        for name, member in list(vars(cls).items()):
            if not isinstance(member, (str, type(None), dict, tuple, int)):
                out[f"{owner}.{name}"] = member
    return out


def kernel_types() -> dict[str, object]:
    """name -> object, for the registry's table and every field of every kernel type in it: a frozen
    dataclass is frozen only to plain assignment (object.__setattr__ rewrites a field, pointing the
    worker's reference at the candidate's answer); a field that is a container is also compared by
    value (`CONTENTS`), since it can change in place."""
    registry = sys.modules.get("harness.kernel_types.registry")
    table = getattr(registry, "_REGISTRY", None) if registry is not None else None
    if not isinstance(table, dict):
        return {}
    out: dict[str, object] = {"harness.kernel_types.registry._REGISTRY": table}
    for name, kt in list(table.items()):
        out[f"registry[{name!r}]"] = kt
        for f in dataclasses.fields(kt) if dataclasses.is_dataclass(kt) else ():
            value = getattr(kt, f.name, None)
            out[f"registry[{name!r}].{f.name}"] = value
            if isinstance(value, (dict, list, set)):
                out[f"registry[{name!r}].{f.name}{CONTENTS}"] = repr(value)
    return out


CONTENTS = " (contents)"  # an entry compared by value, not identity


class IdentityGuard:
    """Snapshot once, before the candidate is imported; `replaced()` names what changed since."""

    def __init__(self, extra_modules: tuple[str, ...] = ()):
        self.extra_modules = extra_modules
        self.snapshot = watched(extra_modules)  # holds the objects: their ids stay theirs
        # Python threads running besides the judge's: a thread the candidate starts runs its code
        # outside every call (unrecorded, untimed, beside the worker writing its records)
        self.threads = _thread._count()

    def replaced(self) -> list[str]:
        now = watched(self.extra_modules)
        changed = [name for name, obj in self.snapshot.items()
                   if (now.get(name, None) != obj if name.endswith(CONTENTS) else now.get(name, None) is not obj)]
        changed += self.threads_started()
        return sorted(changed)

    def clocks_replaced(self) -> list[str]:
        """The clocks alone, right after a call: a few lookups, not the whole snapshot."""
        return sorted(name for name, obj in clocks().items() if self.snapshot.get(name) is not obj) + self.threads_started()

    def threads_started(self) -> list[str]:
        extra = _thread._count() - self.threads
        return [f"the worker's threads ({extra} started by the candidate)"] if extra > 0 else []


def describe(replaced: list[str], where: str) -> str:
    names = ", ".join(replaced[:6]) + (f" and {len(replaced) - 6} more" if len(replaced) > 6 else "")
    verb = "was" if len(replaced) == 1 else "were"
    return (f"{names} {verb} replaced by the candidate (seen {where}): the judge's clocks, sync points and "
            "checks must be the ones it started with")
