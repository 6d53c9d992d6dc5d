"""The child side of `autokernel kernelbench eval`: one mode per isolated subprocess.

    reference  the problem's Model alone; never imports a solution. Outputs of the correctness
               trials and of the checked timed reps, Model's own aten compute ops, whether it
               aliases or mutates its inputs, FLOPs and bytes, eager timing, measured peaks.
    compile    torch.compile(Model) timed, in its own process so a slow compile has its own deadline.
    check      the solution's ModelNew on the same trials: outputs and integrity observations.
    time       ModelNew timed; the outputs of its first and last timed reps are kept.

Each mode writes tensors.pt and then result.json into --out; the file `stage` names the stage in
progress, so the parent can say where a crash or a hang happened. The parent compares outputs and
decides: a solution never sees a reference output, and no comparison runs in its process. What a
solution can still do, with deliberate effort, is tamper with this process's own observers (launch
counting, the aten-op recorder, input fingerprints); no wrong output survives that, since outputs
are checked in the parent against a process that never imported the solution.

KernelBench's protocol (seeds, inputs, the outputs shipped to the parent, timing) is in
harness/kernelbench/kb_protocol.py; this module holds the modes, the solution's loading and the plumbing.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import secrets
import sys
import time
from pathlib import Path

import torch

from harness.timing.compile_cache import baseline_caches
from harness.correctness import launches
from harness.correctness.candidate import error_text, observed_call
from harness.correctness.program_order import ProgramOrders
from harness.correctness.unspecified import Unspecified
from harness.device.versions import versions as judge_versions
from harness.kernelbench.kb_protocol import (PRECISIONS, TIME_SEED, Bench, ProblemError, as_outputs, calibrate_overhead,
                                 fingerprint, forward, load_module, store, sync, time_model, trial_seeds)
from harness.isolation import namespace
from harness.isolation.tamper import IdentityGuard
from harness.timing.witness import Reporter


class SolutionError(Exception):
    """The solution file has no usable ModelNew."""


def output_observations(outs: list[torch.Tensor], inputs: list) -> dict:
    """Per output: exactly a strided torch.Tensor (a subclass or lazy object could fake its values
    later), and not sharing storage with an input (it would change when the caller reuses it)."""
    ptrs = {_storage_ptr(x) for x in inputs if isinstance(x, torch.Tensor)} - {0, -1}
    return {"plain": all(type(t) is torch.Tensor and t.layout == torch.strided for t in outs),
            "aliased": any(_storage_ptr(t) in ptrs for t in outs)}


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # sparse or meta tensors have no plain storage
        return -1


def copy_matching_state(src: torch.nn.Module, dst: torch.nn.Module) -> dict:
    """Parameters and buffers of Model copied into ModelNew where names and shapes match, so a
    randomly initialised layer compares fairly whatever order the solution creates it in."""
    theirs, copied, unmatched = src.state_dict(), [], []
    with torch.no_grad():
        for name, t in dst.state_dict().items():
            s = theirs.get(name)
            if s is not None and tuple(s.shape) == tuple(t.shape):
                t.copy_(s)
                copied.append(name)
            else:
                unmatched.append(name)
    return {"copied": copied, "unmatched": unmatched, "model_state": len(theirs)}


def load_candidate(bench: Bench, solution: str, out: Path, model=None):
    """Model (for its weights; `model` when built already) and the solution's ModelNew with Model's
    matching state."""
    from harness.isolation.static_check import check_source, describe
    model = model if model is not None else bench.build(bench.Model)
    stage(out, "load")
    text = Path(solution).read_text(encoding="utf-8")
    try:
        violations = check_source(text, model=True, filename=Path(solution).name)
    except SyntaxError:
        violations = []  # the import below reports it, with its line
    if violations:
        raise SolutionError(describe(violations, Path(solution).name))
    module = load_module(solution, "kb_solution", candidate=True)
    cls = getattr(module, "ModelNew", None)
    if not isinstance(cls, type):
        raise SolutionError("the solution file defines no class ModelNew")
    new = bench.build(cls)
    state = copy_matching_state(model, new)
    del model
    return new, state


# ---------------------------------------------------------------------------------- the modes
def run_reference(a, bench: Bench, out: Path, tensors: dict) -> dict:
    stage(out, "reference")
    model = bench.build(bench.Model)
    trials = []
    for t, seed in enumerate(trial_seeds(a.trials)):
        inputs = bench.inputs(seed)
        meta = store(tensors, f"trial{t}", as_outputs(forward(model, inputs, seed)))
        trials.append({"seed": seed, "fingerprint": fingerprint(inputs), "outputs": meta})
    inputs = bench.inputs(trials[0]["seed"])
    from torch.utils.flop_counter import FlopCounterMode
    flops = FlopCounterMode(display=False)
    with flops:
        observed = observed_call(lambda *x: forward(model, list(x), trials[0]["seed"]), inputs, {}, _NoLaunches())
    outs = as_outputs(observed.output)
    result = {"trials": trials, "model_ops": sorted(set(observed.forbidden)),
              "aliases_input": output_observations(outs, inputs)["aliased"],
              "mutates_input": bool(observed.mutated),
              "flops": flops.get_total_flops(),
              "bytes": sum(x.numel() * x.element_size() for x in list(inputs) + outs if isinstance(x, torch.Tensor)),
              "device": device_info(bench.device), "versions": judge_versions()}
    stage(out, "timing")
    # every rep's output kept, with its input fingerprint: the answers each timed rep of a solution
    # is held to (the parent compares the reps both children ran on the same values)
    timed = time_model(bench, model, a.reps, a.warmup, keep_outputs=True)
    for rep, outs in timed["kept"].items():
        for k, t in enumerate(outs):
            tensors[f"rep{rep}.{k}"] = t
    result.update(timing=timed["timing"], fresh_sets=timed["fresh_sets"],
                  checked_reps={str(rep): timed["fingerprints"][rep] for rep in timed["kept"]})
    result.update(peaks_for(bench.device))
    return result


class _NoLaunches:
    """A stand-in monitor for Model: every aten compute op it runs is recorded."""
    paused = False
    launches = 0


def run_compile(a, bench: Bench, out: Path, tensors: dict) -> dict:
    stage(out, "compile")
    model = bench.build(bench.Model)
    start = time.perf_counter()
    compiled = torch.compile(model)
    with baseline_caches():  # the problem's own Model: no solution runs in this process
        forward(compiled, bench.inputs(TIME_SEED), TIME_SEED)
    compile_s = time.perf_counter() - start
    stage(out, "timing")
    timed = time_model(bench, compiled, a.reps, a.warmup)
    return {"timing": timed["timing"], "compile_s": compile_s}


def run_check(a, bench: Bench, out: Path, tensors: dict) -> dict:
    monitor = launches.install()  # installed before the import: load_inline'd extensions are counted
    new, state = load_candidate(bench, a.solution, out, a.model)
    a.model = None  # its weights are copied: no second model held while ModelNew runs
    monitor.reset()
    stage(out, "correctness")
    trials, ops, kept = [], set(), None
    for t, seed in enumerate(trial_seeds(a.trials)):
        inputs = bench.inputs(seed)
        fp = fingerprint(inputs)
        call = observed_call(lambda *x: forward(new, list(x), seed), inputs, {}, monitor)
        if call.error:
            return {"error": f"ModelNew.forward raised on trial {t}:\n{call.error}", "stage": "correctness"}
        sync(bench.device)
        obs = {**call.observations(), **output_observations(as_outputs(call.output), inputs)}
        ops |= set(obs.pop("forbidden"))
        trials.append({"seed": seed, "fingerprint": fp, **obs,
                       "outputs": store(tensors, f"trial{t}", as_outputs(call.output))})
        kept = inputs if t == 0 else kept
    stage(out, "replay")
    # the trial-0 buffers refilled in place with trial 1's values: a cache keyed on buffer
    # addresses (or on the tensor objects) answers with trial 0's output here
    fresh = bench.inputs(trials[min(1, len(trials) - 1)]["seed"])
    for dst, src in zip(kept, fresh):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
    store(tensors, "refill", as_outputs(forward(new, kept, trials[min(1, len(trials) - 1)]["seed"])))
    return {"trials": trials, "pytorch_ops": sorted(ops), "state": state, "refill_fingerprint": fingerprint(kept)}


def run_time(a, bench: Bench, out: Path, tensors: dict) -> dict:
    null = calibrate_overhead(bench, a.reps, a.report)  # before the solution exists in this process
    monitor = launches.install()  # as in run_check: the timed calls are watched as the checked were
    new, _ = load_candidate(bench, a.solution, out, a.model)
    a.model = None
    monitor.reset()
    stage(out, "timing")
    timed = time_model(bench, new, a.reps, a.warmup, keep_outputs=True, report=a.report, monitor=monitor)
    timed["null"] = null
    for rep, outs in timed.pop("kept").items():
        for k, t in enumerate(outs):
            tensors[f"rep{rep}.{k}"] = t
    timed["fingerprints"] = {str(k): v for k, v in timed["fingerprints"].items()}
    return timed


MODES = {"reference": run_reference, "compile": run_compile, "check": run_check, "time": run_time}


# ---------------------------------------------------------------------------------- plumbing
def stage(out: Path, name: str) -> None:
    (out / "stage").write_text(name)


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "capability": f"sm_{props.major}{props.minor}",
                "memory_gb": round(props.total_memory / 2 ** 30, 1)}
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "triton_interpreter": os.environ.get("TRITON_INTERPRET") == "1"}


def peaks_for(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"peaks": None, "peaks_note": "no roofline on the CPU: interpreter timings say nothing about a GPU"}
    try:
        from harness.device.peaks import measured_peaks
        return {"peaks": measured_peaks(str(device))}
    except Exception as e:  # a failed probe costs the roofline flag, never the verdict
        return {"peaks": None, "peaks_note": f"peaks not measured: {type(e).__name__}: {e}"}


def write_result(out: Path, result: dict, tensors: dict) -> None:
    torch.save(tensors, out / "tensors.pt")
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, out / "result.json")  # its presence means the child finished


def _recorder_without_dynamo() -> None:
    """TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo, whose first
    call imports torch._dynamo: 1.2 s of CPU in every child. The recorder never runs under
    torch.compile here, so its own function stands in as the 'disabled' one."""
    from harness.correctness.integrity import ComputeRecorder
    raw = getattr(ComputeRecorder.__torch_dispatch__, "__wrapped__", None)
    if raw is not None:
        raw.__dynamo_disable = raw


def enter_sandbox(a, network: dict | None = None) -> dict:
    """Confine this process before the solution is imported (what the child needs is loaded first)."""
    from harness.isolation import sandbox
    if a.no_sandbox or not a.sandbox_write:
        return sandbox.not_requested()
    import triton  # noqa: F401  (imported while it may still write)
    if a.device == "cuda":
        torch.cuda.init()
    state = sandbox.confine(a.sandbox_write, readable=[a.problem], namespace=network)
    from harness.correctness import candidate
    candidate.sandbox_active = state["kind"] == "landlock"
    return state


def install_audit_hook(a, state: dict) -> None:
    """The audit hook, before the solution is imported (harness/isolation/audit_hook.py)."""
    from harness.isolation import audit_policy, sandbox
    from harness.isolation.static_check import allowed_imports
    audit_policy.install_for_candidate(
        candidate_dir=str(Path(a.solution).resolve().parent), records_dir=str(a.out.resolve()),
        sandbox_write=a.sandbox_write, reads=[*(state.get("reads") or sandbox.read_roots()), str(a.problem)],
        allowed=allowed_imports(model=True), report=a.report.refused if a.report else None, extensions=True)


def prepare(a, network: dict | None = None) -> tuple[dict, IdentityGuard]:
    """Everything between the child's own imports and the solution's import, in order: the launch
    monitor, the OS sandbox (recorded beside the result, kept if the solution crashes), the watch on
    text reads, the identity snapshot, the audit hook. (tests/rehearsal runs a first real launch
    behind exactly this.)"""
    # the one launch monitor, before the sandbox, the identity snapshot and the import; with the
    # secret order of each launch's programs (harness/correctness/program_order.py)
    monitor = launches.install()
    monitor.orders, monitor.unspecified = ProgramOrders(secrets.randbits(64)), Unspecified(secrets.randbits(64))
    state = enter_sandbox(a, network)
    (a.out / "sandbox.json").write_text(json.dumps(state))
    from harness.correctness.integrity import watch_text_reads
    watch_text_reads()  # a tensor's repr counts as a host read while recorded
    guard = IdentityGuard(("__main__",))  # before the solution is imported
    install_audit_hook(a, state)
    return state, guard


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.kernelbench.kb_worker")
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("--problem", required=True)
    p.add_argument("--solution")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=sorted(PRECISIONS))
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sandbox-write", action="append", default=[], help="a folder the sandbox lets it write")
    p.add_argument("--no-sandbox", action="store_true", help="run the solution without the OS sandbox")
    p.add_argument("--witness", default=None, help="the judge's witness socket: every timed rep is reported there")
    a = p.parse_args(argv)
    a.report = Reporter(a.witness) if a.witness else None  # connected before the sandbox closes sockets
    # before any thread starts: a user namespace needs a single-threaded process
    network = None if not a.solution or a.no_sandbox or not a.sandbox_write else namespace.isolate_for(a.device)
    faulthandler.enable()  # a segfault in a kernel leaves a Python traceback in stderr for the verdict
    if a.mode in ("reference", "check"):
        _recorder_without_dynamo()
    tensors: dict[str, torch.Tensor] = {}
    stage(a.out, "load_problem")
    sandbox_state, guard = None, None
    try:
        bench = Bench(a.problem, a.device, a.precision)
        # built before the sandbox: a module target's Model reads its weights beside the problem
        a.model = bench.build(bench.Model) if a.solution else None
        if a.solution:
            sandbox_state, guard = prepare(a, network)
        result = MODES[a.mode](a, bench, a.out, tensors)
        if guard is not None:
            result["identity"] = {"where": f"after {a.mode}", "replaced": guard.replaced()}
    except ProblemError as e:
        result = {"problem_error": str(e)}
    except SolutionError as e:
        result = {"error": str(e), "stage": "load", "no_model_new": True}
    except Exception as e:  # the solution's (or the problem's) exception, reported, not raised
        where = (a.out / "stage").read_text()
        result = {"error": error_text(e), "stage": where}
        if a.mode == "reference":  # only Model ran: the problem is broken, not a solution
            result = {"problem_error": f"the problem's Model failed during {where}:\n{error_text(e)}"}
    if sandbox_state is not None:
        result["sandbox"] = sandbox_state
    write_result(a.out, {"mode": a.mode, **result}, tensors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
