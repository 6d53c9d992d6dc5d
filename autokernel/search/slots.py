"""Judge slots: where experiments in flight are judged, one candidate per slot at a time.

A slot is a device: a GPU (its timings never share it with another candidate's) or, on the CPU, one
CPU slot. `LocalSlots` keep one thread per slot on this machine, each calling the judge (itself a
fresh subprocess per candidate) with that slot's device; `RaySlots` keep one Ray actor per slot,
pinned to a GPU (`num_gpus=1`) or to a CPU, which receives the candidate's text and the target as
plain data, writes the text into its own temp folder and judges it there. The run folder stays
with the one writer (autokernel.search.parallel); a slot returns a verdict and writes nothing of the run.
"""
from __future__ import annotations

import contextlib
import os
import queue
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autokernel.errors import UsageError, UserError

RAY_INSTALL = "pip install 'autokernel[ray]' (or pip install ray) on every machine of the cluster"


@dataclass(frozen=True)
class Slot:
    device: str  # "cpu" or "cuda": the judge's device
    index: str | None = None  # the CUDA device index the judge's child is pinned to


@dataclass(frozen=True)
class JudgeJob:
    """One candidate to judge: its file in the run (local slots) and its text (remote slots)."""

    path: Path
    source: str
    case: Any  # harness.kernel_types.registry.Case
    arch: str
    timeout_s: float | None
    time_around: bool = False  # also the shapes around the target (harness/verdict/around.py) ...
    around_below_us: float | None = None  # ... when faster there than this
    backward: bool = False  # a training run: its backward_fn judged too

    def around(self) -> dict:
        opts = {"backward": True} if self.backward else {}
        return {**opts, "time_around": True, "around_below_us": self.around_below_us} if self.time_around else opts


def parse_devices(text: str | None) -> list[str] | None:
    """'0,1,3' -> ['0', '1', '3']."""
    if text is None:
        return None
    devices = [d.strip() for d in str(text).split(",") if d.strip()]
    if not devices or not all(d.isdigit() for d in devices) or len(set(devices)) != len(devices):
        raise UsageError(f"cannot read --devices {text!r}", "give distinct CUDA device indices, e.g. --devices 0,1,2,3")
    return devices


def local_slots(device: str, workers: int = 1, devices: list[str] | None = None) -> list[Slot]:
    """One slot per CUDA device (--devices, else the first `workers`), or `workers` CPU slots."""
    if workers < 1:
        raise UsageError(f"--workers {workers} is not a number of judges", "give --workers 1 or more")
    if device == "cpu":
        if devices:
            raise UsageError("--devices names CUDA devices, but this run judges on the CPU",
                             "use --workers N for N CPU slots, or --device cuda")
        return [Slot("cpu") for _ in range(workers)]
    if devices is None:
        devices = [str(i) for i in range(workers)] if workers > 1 else [None]
    return [Slot("cuda", index) for index in devices]


class ThreadSlots:
    """A thread per slot: `submit` returns a future of the verdict; a slot is taken from the free
    ones for each job and given back when its verdict is in."""

    remote = False  # True: the judges are elsewhere, so every candidate goes through a slot

    def __init__(self, slots: list[Any]):
        self.width = len(slots)
        self._free: queue.Queue = queue.Queue()
        for slot in slots:
            self._free.put(slot)
        self._threads = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="judge-slot")

    def submit(self, job: JudgeJob) -> Future:
        return self._threads.submit(self._run, job)

    def _run(self, job: JudgeJob) -> dict:
        slot = self._free.get()
        try:
            return self.call(slot, job)
        finally:
            self._free.put(slot)

    def call(self, slot: Any, job: JudgeJob) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class LocalSlots(ThreadSlots):
    """Slots on this machine: the judge is called (through its subprocess boundary) with the
    slot's device; a CUDA slot pins the judge's child to its GPU."""

    def __init__(self, judge: Callable[..., dict], slots: list[Slot]):
        super().__init__(slots)
        self.judge = judge

    def call(self, slot: Slot, job: JudgeJob) -> dict:
        extra = {} if slot.index is None else {"visible_devices": slot.index}
        return self.judge(job.path, target=job.case, device=slot.device, arch=job.arch,
                          timeout_s=job.timeout_s, **extra, **job.around())


# ====================================================================== Ray
class JudgeActor:
    """A judge on a Ray worker: the candidate arrives as text, is judged in a temp folder of the
    actor's own, and the verdict goes back as plain data. The actor holds one judge session for its
    life, as a local run does: a pre-imported worker forks per candidate, and the torch.compile
    baseline is timed once per target."""

    def __init__(self):
        from harness.workers.judge_session import judge_session
        self._session = contextlib.ExitStack()  # its zygote ends with the actor's process (EOF)
        self._session.enter_context(judge_session())

    def judge(self, source: str, name: str, case: dict, device: str, arch: str,
              timeout_s: float | None, around: dict | None = None) -> dict:
        from harness.judge import JudgeUsageError, judge
        from harness.kernel_types.registry import Case
        with tempfile.TemporaryDirectory(prefix="ak-ray-") as tmp:
            path = Path(tmp, name)
            path.write_text(source, encoding="utf-8")
            try:
                return judge(path, target=Case.from_json(case), device=device, arch=arch, timeout_s=timeout_s,
                             **(around or {}))
            except JudgeUsageError as e:
                return {"judge_usage_error": str(e)}


def crash_verdict(detail: str, device: str) -> dict:
    """A slot lost while it judged (its machine or actor died): the candidate's CRASH."""
    return {"verdict": "CRASH", "failed_stage": "compile", "timing": None, "roofline": None,
            "stages": [{"name": "compile", "status": "fail", "detail": detail, "seconds": 0.0}],
            "device": {"type": device}}


class RaySlots(ThreadSlots):
    """One Ray actor per slot: `num_gpus=1` each on a CUDA run, `num_cpus=1` each on the CPU."""

    remote = True

    def __init__(self, ray: Any, device: str, width: int, started_here: bool):
        self.ray, self.device, self.started_here = ray, device, started_here
        resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
        actor = ray.remote(**resources, max_restarts=-1)(JudgeActor)
        self.actors = [actor.remote() for _ in range(width)]
        super().__init__(self.actors)

    def call(self, actor: Any, job: JudgeJob) -> dict:
        try:
            verdict = self.ray.get(actor.judge.remote(job.source, job.path.name, job.case.to_json(),
                                                      self.device, job.arch, job.timeout_s, job.around()))
        except self.ray.exceptions.RayError as e:
            return crash_verdict(f"the Ray worker judging it was lost: {type(e).__name__}: {str(e)[:300]}",
                                 self.device)
        if "judge_usage_error" in verdict:
            raise UserError(f"the judge cannot run on the Ray cluster: {verdict['judge_usage_error']}",
                            "check --device (every worker needs that device), then --resume")
        return {**verdict, "kernel_file": str(job.path)}  # the run's file, not the actor's copy

    def close(self) -> None:
        super().close()
        for actor in self.actors:
            self.ray.kill(actor)
        if self.started_here:
            self.ray.shutdown()


def ray_slots(address: str, device: str, workers: int) -> RaySlots:
    """Connect to the cluster at `address` ("auto": the one this machine belongs to; "local": start
    one here), or use the Ray this process already started; one actor per GPU (or CPU) unless
    --workers says how many."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray, which is not installed", RAY_INSTALL) from None
    started_here = not ray.is_initialized()
    if started_here:
        local = address == "local"
        # the actors import autokernel and harness: a cluster started here finds them as we do;
        # the machines of another cluster need autokernel installed
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds autokernel/ and harness/
        path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        try:
            ray.init(address=None if local else address, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path}} if local else None)
        except Exception as e:  # no cluster there, or one of another Ray version
            raise UserError(f"cannot reach the Ray cluster at {address}: {e}",
                            "start one with `ray start --head` (or use --ray local), then resume") from None
    if workers <= 1:
        workers = int(ray.cluster_resources().get("GPU" if device == "cuda" else "CPU", 0))
    if workers < 1:
        raise UserError(f"the Ray cluster at {address} has no {'GPU' if device == 'cuda' else 'CPU'} for a judge",
                        "add nodes with that device, or run without --ray")
    return RaySlots(ray, device, workers, started_here)


def make_slots(judge: Callable[..., dict], device: str, *, workers: int = 1, devices: list[str] | None = None,
               ray_address: str | None = None) -> ThreadSlots:
    if ray_address:
        if devices:
            raise UsageError("--devices picks GPUs of this machine; with --ray, Ray places the judges",
                             "drop --devices (use --workers to cap the judges)")
        return ray_slots(ray_address, device, workers)
    return LocalSlots(judge, local_slots(device, workers, devices))
