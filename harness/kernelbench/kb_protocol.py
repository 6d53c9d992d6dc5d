"""KernelBench's protocol in the judge's child (harness/kernelbench/kb_worker.py): seeds, the problem's inputs and
models, the outputs handed to the parent, input fingerprints, and timing with refilled inputs.

Protocol (KernelBench's): torch.manual_seed(42) before get_init_inputs() and before building each
model; trial seeds drawn from torch.manual_seed(42) then randint(0, 2**32 - 1); the seed is set
again before each input set and each forward. Every forward runs under torch.no_grad().
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import time
from typing import Any

import torch

from harness.correctness.candidate import error_text

SEED = 42
TIME_SEED = 10_000  # timed reps get seeds TIME_SEED + i, far from the trial seeds
SHIP_MAX_ELEMS = 2 ** 25  # larger outputs travel to the parent as a strided sample
REFILL_BUDGET_S = 10.0  # seconds of get_inputs() calls one timing run may spend on fresh values
KEEP_BYTES = 512 * 2**20  # the timed outputs one child keeps for the parent, at most (the last rep's always)
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class ProblemError(Exception):
    """The problem file itself does not load or run: not the solution's fault."""


def trial_seeds(n: int) -> list[int]:
    torch.manual_seed(SEED)
    return [int(torch.randint(0, 2 ** 32 - 1, (1,)).item()) for _ in range(n)]


def load_module(path: str, name: str, candidate: bool = False):
    """Import a file as `name`; a candidate's module is registered with the audit hook first."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # @triton.jit reads the source through the module
    if candidate:
        from harness.isolation import audit_hook
        audit_hook.register(module)
    spec.loader.exec_module(module)
    return module


class Bench:
    """The problem's functions with KernelBench's seeding and casting, captured before any
    solution code runs (a solution cannot swap get_inputs for a friendlier one)."""

    def __init__(self, path: str, device: str, precision: str):
        try:
            self.module = load_module(path, "kb_problem")
        except Exception as e:
            raise ProblemError(f"the problem file failed to load:\n{error_text(e)}") from e
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(self.module, n)]
        if missing:
            raise ProblemError(f"the problem file lacks {', '.join(missing)}")
        self.Model, self.get_inputs = self.module.Model, self.module.get_inputs
        self.get_init_inputs = self.module.get_init_inputs
        self.device, self.dtype = torch.device(device), PRECISIONS[precision]

    def prepare(self, values) -> list:
        out = []
        for v in values:
            if isinstance(v, torch.Tensor):
                v = v.to(self.device)
                v = v.to(self.dtype) if v.is_floating_point() else v
            out.append(v)
        return out

    def inputs(self, seed: int) -> list:
        torch.manual_seed(seed)
        return self.prepare(list(self.get_inputs()))

    def build(self, cls) -> torch.nn.Module:
        torch.manual_seed(SEED)
        init = self.prepare(list(self.get_init_inputs()))
        torch.manual_seed(SEED)
        with torch.no_grad():
            model = cls(*init)
        return model.to(device=self.device, dtype=self.dtype)


def forward(model, inputs: list, seed: int):
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(*inputs)


def as_outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and result and all(isinstance(r, torch.Tensor) for r in result):
        return list(result)
    raise TypeError(f"forward returned {type(result).__name__}, expected a tensor or a tuple of tensors")


def ship(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy to hand to the parent; huge outputs as a deterministic strided sample."""
    t = t.detach()
    if t.numel() > SHIP_MAX_ELEMS:
        t = t.reshape(-1)[:: -(-t.numel() // SHIP_MAX_ELEMS)]
    return t.to("cpu", copy=True)


def store(tensors: dict, key: str, outputs: list[torch.Tensor]) -> list[dict]:
    meta = []
    for k, t in enumerate(outputs):
        tensors[f"{key}.{k}"] = ship(t)
        meta.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                     "numel": t.numel(), "sampled": t.numel() > SHIP_MAX_ELEMS})
    return meta


def fingerprint(values: list) -> str:
    """A hash of the input values (a strided sample of huge tensors): both processes must have
    judged the same inputs."""
    h = hashlib.sha256()
    for v in values:
        if isinstance(v, torch.Tensor):
            flat = v.detach().reshape(-1)
            flat = flat[:: max(1, -(-flat.numel() // 2 ** 22))].to("cpu").contiguous()
            h.update(f"{tuple(v.shape)}{v.dtype}".encode())
            h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        else:
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Refill:
    """Fresh values written in place into the timed buffers before each call (outside the timed
    region): a result cache keyed on buffer addresses returns stale answers, which the parent
    catches in the checked reps. When get_inputs() is slow, the values cycle through a pool sized
    to REFILL_BUDGET_S; the first and last reps always get their own seeds. With `every_rep`, each
    rep's input fingerprint is kept (the parent compares a rep's output only where the reference's
    child ran that rep on the same values), else the first and last reps'."""

    def __init__(self, bench: Bench, bufs: list, reps: int, warmup: int, every_rep: bool = False):
        self.bench, self.bufs, self.last = bench, bufs, reps - 1
        self.unique, self.pool, self.fingerprints = reps + warmup, {}, {}
        self.every_rep, self._prints = every_rep, {}

    def seed_of(self, i: int) -> int:
        return TIME_SEED + (i if i in (0, self.last) else i % self.unique)

    def __call__(self, i: int) -> None:
        seed = self.seed_of(i)
        values = self.pool.get(seed)
        if values is None:
            start = time.perf_counter()
            values = self.bench.inputs(seed)
            spent_s = time.perf_counter() - start
            self.unique = max(2, min(self.unique, int(REFILL_BUDGET_S / max(spent_s, 1e-9))))
            if self.unique < self.last + 1:
                self.pool[seed] = values
        if i in (0, self.last) or (self.every_rep and i >= 0):
            if seed not in self._prints:
                self._prints[seed] = fingerprint(values)
            self.fingerprints[i] = self._prints[seed]
        with torch.no_grad():
            for dst, src in zip(self.bufs, values):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
        torch.manual_seed(seed)  # the rep's forward sees the RNG state the reference used


MODEL_PHASE = "model"


def calibrate_overhead(bench: Bench, reps: int, report) -> dict:
    """The null call timed like a model on the same refilled buffers, before the solution is
    imported: the overhead the judging process's clock sees around an empty timed region."""
    from harness.timing.timer import calibrate
    bufs = bench.inputs(TIME_SEED)
    refill = Refill(bench, bufs, reps, 0)
    with torch.no_grad():
        return calibrate(device=str(bench.device), report=report, reps=reps, before_each=refill).to_json()


def time_model(bench: Bench, model, reps: int, warmup: int, keep_outputs: bool = False, report=None,
               monitor=None) -> dict:
    """Time model(*bufs) with time_fn: fixed rep count, refilled inputs, raw samples kept, every
    rep reported to `report` (harness/timing/witness.py) as it ends. With `keep_outputs`, every timed
    rep's output (up to KEEP_BYTES) and its input fingerprint come back, for the parent to compare
    with the reference child's same rep. With `monitor` (a solution's timing),
    every timed call runs as its checked calls did: under the same ComputeRecorder and LaunchMonitor,
    so it cannot tell them apart by the dispatch stack; the aten compute ops it ran while timed come
    back as "timed_ops", for the parent to hold to those its checked calls ran. The reference model
    is timed unrecorded: recording can only understate a solution's speedup."""
    from harness.correctness.integrity import ComputeRecorder
    from harness.timing.timer import time_fn
    bufs = bench.inputs(TIME_SEED)
    refill = Refill(bench, bufs, reps, warmup, every_rep=keep_outputs)
    state: dict[str, Any] = {}
    kept: dict[int, list] = {}
    kept_bytes = [0]
    recorder = ComputeRecorder(monitor) if monitor is not None else None

    def call() -> None:
        if recorder is None:
            state["out"] = model(*bufs)
            return
        with recorder:
            state["out"] = model(*bufs)

    def keep(i: int) -> None:
        """Rep i's output, shipped before the next rep can overwrite a reused buffer: every rep's
        while they fit KEEP_BYTES, the last rep's always."""
        outs = as_outputs(state["out"])
        size = sum(min(t.numel(), SHIP_MAX_ELEMS) * t.element_size() for t in outs)
        if i == reps - 1 or kept_bytes[0] + size <= KEEP_BYTES:
            kept[i] = [ship(t) for t in outs]
            kept_bytes[0] += size

    def before_each(i: int) -> None:
        if keep_outputs and i >= 1:
            keep(i - 1)
        refill(i)

    with torch.no_grad():
        timing = time_fn(call, device=str(bench.device), warmup=warmup, min_reps=reps, max_reps=reps,
                         before_each=before_each, report=report, phase=MODEL_PHASE)
        if keep_outputs:
            keep(reps - 1)
    result = {"timing": timing.to_json(), "kept": kept, "fingerprints": refill.fingerprints,
              "fresh_sets": refill.unique}
    if recorder is not None:
        result["timed_ops"] = sorted(set(recorder.forbidden))
    if bench.device.type == "cuda":
        result["host_wall_median_us"] = _host_wall_median_us(call, refill, bench.device)
    return result


def _host_wall_median_us(call, refill: Refill, device: torch.device, reps: int = 10) -> float:
    """Wall time from launch to a device-wide synchronize: work hidden on a side stream, which
    CUDA events on the current stream do not see, shows up here."""
    samples = []
    with torch.no_grad():
        for i in range(reps):
            refill(i)
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            call()
            torch.cuda.synchronize(device)
            samples.append((time.perf_counter() - start) * 1e6)
    return sorted(samples)[len(samples) // 2]
