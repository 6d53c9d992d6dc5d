"""The judge's child process: runs one candidate through the stages and records what it saw.

Everything here runs beside untrusted code, so nothing here decides the verdict: outputs are saved
to files (of the timed ones, the sample a secret key chose: harness/timing/timed_outputs.py) and the
parent (harness/judge.py), which never imports the candidate, recomputes the float64 references
and compares. The child's own comparisons (of the stages' outputs, and of every timed output on
the device) only decide when to stop early, or give the parent a reason to fail it.

Usage (the parent does this): python -m harness.workers.worker KERNEL_FILE OUT_DIR --device cpu [--target JSON]
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

import harness.cuda_launcher  # noqa: F401  (CUDA candidates' host side: in the identity snapshot)
from harness.verdict import around, grid_fill
from harness.isolation import audit_policy, namespace
from harness.timing import measurement
from harness.kernel_types import registry
from harness.correctness.candidate import (CallResult, ContractError, check_header, check_signature, error_text,
                               import_candidate, observed_call, read_header)
from harness.correctness.cases import DETERMINISM_CALLS, Capabilities, Plan, build_plan
from harness.correctness.compare import bitwise_equal, compare
from harness.correctness import as_passed, guards, launches, program_order, unspecified
from harness.correctness.integrity import watch_text_reads
from harness.kernel_types.registry import Case
from harness.isolation.static_check import check_source, describe
from harness.isolation.tamper import IdentityGuard
from harness.timing.fresh_inputs import NoiseSecret
from harness.timing.witness import Reporter

MAX_WARPS = 32  # 1024 threads per block, CUDA's limit on every architecture


# bound before any candidate is imported: the digests the judge is sent are the judge's own, and
# an output is saved by torch's own methods (a tensor's detach looked up at save time could be the
# candidate's, finishing the work after the timed region)
_sha256, _dumps, _save = hashlib.sha256, json.dumps, torch.save
_detach, _to, _clone = torch.Tensor.detach, torch.Tensor.to, torch.Tensor.clone


class Log:
    """Append-only event log, flushed per line so a crash keeps everything before it. Every line's
    digest, and every saved output's, goes to the judge's witness as it is written (`report`):
    the judge holds the file to what it was told (harness/verdict/records.py), so a record or an
    output written or rewritten by anyone else fails the candidate."""

    def __init__(self, out_dir: Path, report=None):
        self.dir = out_dir
        (out_dir / "tensors").mkdir(parents=True, exist_ok=True)
        self._f = open(out_dir / "events.jsonl", "a", encoding="utf-8")
        self._n = 0
        self._stage_start = 0.0
        self.report = report

    def event(self, **fields) -> None:
        fields.setdefault("t", time.time())
        line = _dumps(fields, default=str)
        self._f.write(line + "\n")
        self._f.flush()
        if self.report is not None:
            self.report.record(_sha256(line.encode()).hexdigest())

    def start(self, stage: str) -> None:
        self._stage_start = time.perf_counter()
        self.event(event="stage_start", stage=stage)

    def end(self, stage: str, status: str, detail: str, **extra) -> None:
        self.event(event="stage_end", stage=stage, status=status, detail=detail,
                   seconds=time.perf_counter() - self._stage_start, **extra)

    def save(self, tensor) -> str | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        self._n += 1
        name = f"t{self._n:04d}.pt"
        buffer = io.BytesIO()
        _save(_clone(_to(_detach(tensor), "cpu")), buffer)
        data = buffer.getvalue()
        (self.dir / "tensors" / name).write_bytes(data)
        if self.report is not None:  # the hash travels as the output is written: a later rewrite fails
            self.report.output(name, _sha256(data).hexdigest())
        return name


class Worker:
    def __init__(self, path: Path, log: Log, device: str, arch: str, target: Case | None,
                 eager_median_us: float | None = None, report=None, around: dict | None = None):
        self.path, self.log, self.device, self.arch, self.target = path, log, device, arch, target
        # the clean worker's eager median at the target (harness/workers/baseline.py), handed in by
        # the judge: it only decides whether a first round gets a second look, which the judge rechecks
        self.eager_median_us = eager_median_us
        self.report = report  # harness/timing/witness.py's Reporter: every timed rep, as it ends
        self.around = around  # {"below_us": float or None}: also time the shapes around the target
        bf16 = device == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        self.caps = Capabilities(device, bf16)
        # the process's one launch monitor, installed before the candidate exists and never replaced:
        # the same wrappers a served kernel sees (harness/correctness/launches.py)
        self.monitor = launches.install()
        self.module = None
        self.has_backward = False
        self.judge_backward = False
        self.kt: registry.KernelType | None = None
        self.guard: IdentityGuard | None = None
        self.backend = "triton"
        self.calibration: dict = {}
        # drawn before the candidate is imported: the salt of the timed calls' fresh values
        self.noise = NoiseSecret()
        # ... and the secret order each launch's programs run in (harness/correctness/program_order.py)
        self.monitor.orders = program_order.ProgramOrders(secrets.randbits(64))
        # ... and its answers to what a GPU leaves unspecified (harness/correctness/unspecified.py)
        self.monitor.unspecified = unspecified.Unspecified(secrets.randbits(64))

    def clocks_untouched(self, where: str) -> bool:
        """Right after a call of kernel_fn: its clocks and sync points are the originals. Recorded
        only when one is not (the parent fails `integrity` on any record that names one)."""
        replaced = self.guard.clocks_replaced() if self.guard is not None else []
        if replaced:
            self.log.event(event="identity", where=where, replaced=replaced)
        return not replaced

    def untouched(self, where: str) -> bool:
        """Record whether the clocks, sync points and the judge's functions are still the originals;
        the parent fails `integrity` on any record that names a replacement, or on a missing one."""
        if self.guard is None:
            return True
        replaced = self.guard.replaced()
        self.log.event(event="identity", where=where, replaced=replaced)
        return not replaced

    # -- compile ----------------------------------------------------------------------------
    def plan(self) -> Plan | None:
        """The header, the stage plan and the static check: everything decided before an import."""
        try:
            header = read_header(self.path)
            check_header(header)
        except ContractError as e:
            return self._refused(str(e), usage_error=True)
        except SyntaxError as e:
            return self._refused(f"syntax error: {e}")
        self.kt = registry.get(header["KERNEL_TYPE"])
        self.backend = header.get("BACKEND", "triton")
        # judged only for a training target (the judge says so): an inference target serves the forward
        self.has_backward = bool(header.get("has_backward_fn")) and self.judge_backward
        violations = check_source(self.path.read_text(encoding="utf-8"), self.backend)
        if violations:
            return self._refused(describe(violations, self.path.name))
        return build_plan(self.kt.name, self.caps, self.target)

    @property
    def compile_only(self) -> bool:
        """A CUDA C++ candidate without a GPU: compiled for the target, never run."""
        return self.backend == "cuda" and self.device == "cpu"

    def _refused(self, detail: str, **extra) -> None:
        self.log.start("compile")
        self.log.end("compile", "fail", detail, **extra)
        return None

    def compile(self, plan: Plan) -> bool:
        self.log.start("compile")
        try:
            self.module = import_candidate(self.path)
        except Exception as e:
            self.log.end("compile", "fail", f"importing the file failed:\n{error_text(e)}")
            return False
        if not self.untouched("after import"):
            self.log.end("compile", "fail", "the candidate replaced the judge's clocks or functions at import")
            return False
        problem = check_signature(getattr(self.module, "kernel_fn", None), self.kt)
        if problem:
            self.log.end("compile", "fail", problem)
            return False
        backend = getattr(self.module, "BACKEND", "triton")
        return self._compile_cuda(plan) if backend == "cuda" else self._compile_triton(plan)

    def _compile_triton(self, plan: Plan) -> bool:
        case = plan.stages["smoke"][0]
        args, kwargs = registry.build_inputs(case, self.device)
        # from the first call on, every distinct specialization is kept, and compiled for the target
        # when the stage that first launched it ends (specializations_problem)
        self.monitor.recording = True
        result = observed_call(self.module.kernel_fn, args, kwargs, self.monitor)
        self.clocks_untouched("right after the first call of kernel_fn")
        if result.error:
            self.log.end("compile", "fail", f"the first call failed:\n{result.error}")
            return False
        how = "ran under the Triton interpreter" if self.device == "cpu" else "compiled and ran on the GPU"
        records = self.monitor.take_records()
        resources, detail = None, f"{result.launches} Triton launch(es); {how}"
        target = _target_compile()
        if target is not None and records:
            try:
                tc = target.compile_triton(records, self.arch)
            except Exception as e:  # a fault in our compile-for-target support is not the candidate's
                self.log.end("compile", "pass", f"{detail}; no {self.arch} resources: {error_text(e, 2)}")
                return True
            if not tc.ok:
                self.log.end("compile", "fail", tc.detail)
                return False
            resources, detail = tc.resources, f"{detail}; {tc.detail}"
        self.log.end("compile", "pass", detail, resources=resources)
        return True

    def _compile_cuda(self, plan: Plan) -> bool:
        target = _target_compile()
        if target is None:
            self.log.end("compile", "fail", "CUDA C++ compile-for-target support is not installed")
            return False
        tc = target.compile_cuda(self.module, self.arch)
        if not tc.ok:
            self.log.end("compile", "fail", tc.detail)
            return False
        if self.compile_only:
            self.log.end("compile", "pass", f"{tc.detail}; no GPU here: compiled for {self.arch}, not run",
                         resources=tc.resources, compile_only=True)
            return False
        self.log.end("compile", "pass", tc.detail, resources=tc.resources)
        return True

    def specializations_problem(self) -> str | None:
        """Every Triton specialization first launched since the last look, compiled for the target:
        why one does not, or None (harness/workers/specializations.py)."""
        if self.backend != "triton" or _target_compile() is None:
            return None
        from harness.workers.specializations import new_specializations_problem
        return new_specializations_problem(self.monitor, self.arch)

    def passed(self, stage: str, detail: str) -> bool:
        """End a stage whose cases passed: it passes when what it launched compiles for the target."""
        problem = self.specializations_problem()
        self.log.end(stage, "fail" if problem else "pass", problem or detail)
        return not problem

    # -- running cases ----------------------------------------------------------------------
    def inputs(self, case: Case) -> CaseInputs:
        """A case's inputs as a model passes them: every storage in a guarded buffer
        (harness/correctness/guards.py), weights as nn.Parameters, in the case's grad mode
        (harness/correctness/as_passed.py)."""
        args, kwargs = registry.build_inputs(case, self.device)
        mode, params = as_passed.mode_for(case.seed), self.kt.params[:len(args)]
        placed = guards.place(args, case.seed, list(params),
                              as_passed.inference_positions(self.kt.name, params, mode))
        return CaseInputs(placed, as_passed.wrap(placed.args, self.kt.name, params, mode), kwargs, mode)

    def call(self, stage: str, role: str, case: Case, inputs: CaseInputs, *,
             save_inputs: bool = False, **extra) -> CallResult:
        """One observed call of kernel_fn, recorded (output saved) for the judge to recheck."""
        result = observed_call(self.module.kernel_fn, inputs.passed, inputs.kwargs, self.monitor, inputs.placed,
                               inputs.mode)
        self.clocks_untouched(f"right after a call of kernel_fn in {stage}")
        if save_inputs:
            extra["inputs_after"] = [self.log.save(t) for t in inputs.placed.args]
        self.log.event(event="case", stage=stage, role=role, case=case.to_json(), label=case.label(),
                       output=self.log.save(result.output), error=result.error, passed_as=inputs.mode,
                       obs=result.observations(), seconds=result.seconds, **extra)
        return result

    def run_case(self, stage: str, case: Case) -> tuple[bool, str]:
        result = self.call(stage, "check", case, self.inputs(case))
        if result.error:
            return False, f"{case.label()}: kernel_fn raised\n{result.error}"
        if result.program_order:  # a launch's programs read what others of it wrote
            return False, f"{case.label()}: {result.program_order[0]}"
        too_many = {name: w for name, w in self.monitor.most_warps.items() if w > MAX_WARPS}
        if too_many:
            # a GPU refuses the launch; the interpreter runs it whatever the warps
            name, warps = next(iter(too_many.items()))
            return False, (f"{case.label()}: {name} launched with num_warps={warps} ({32 * warps} threads per "
                           f"block); CUDA allows at most {32 * MAX_WARPS} (num_warps <= {MAX_WARPS}), so it "
                           "would fail to launch on a GPU")
        cmp = compare(result.output, registry.reference_output(case), case)
        return cmp.ok, f"{case.label()}: {cmp.detail}"

    def correctness_stage(self, stage: str, cases: list[Case]) -> bool:
        self.log.start(stage)
        for case in cases:
            ok, detail = self.run_case(stage, case)
            if not ok:
                self.log.end(stage, "fail", detail)
                return False
        return self.passed(stage, f"{len(cases)} cases")

    def determinism(self, cases: list[Case]) -> bool:
        self.log.start("determinism")
        for case in cases:
            outputs = []
            for _ in range(DETERMINISM_CALLS):
                result = self.call("determinism", "repeat", case, self.inputs(case))
                if result.error:
                    self.log.end("determinism", "fail", f"{case.label()}: kernel_fn raised\n{result.error}")
                    return False
                outputs.append(result.output)
            if not all(isinstance(o, torch.Tensor) and bitwise_equal(o.cpu(), outputs[0].cpu()) for o in outputs):
                self.log.end("determinism", "fail", f"{case.label()}: repeated calls on identical inputs differ")
                return False
        return self.passed("determinism", f"{DETERMINISM_CALLS} identical calls bitwise equal")

    def integrity(self, cases: list[Case]) -> bool:
        """Replay: the same input buffers refilled in place with new values must give new results."""
        self.log.start("integrity")
        first, second = cases[0], cases[1]
        inputs = self.inputs(first)
        a = self.call("integrity", "replay_first", first, inputs, save_inputs=True)
        refill(inputs.placed.args, registry.build_inputs(second, self.device)[0])
        first_copy = a.output.clone() if isinstance(a.output, torch.Tensor) else None
        b = observed_call(self.module.kernel_fn, inputs.passed, inputs.kwargs, self.monitor, inputs.placed,
                          inputs.mode)
        self.clocks_untouched("right after a call of kernel_fn in integrity")
        # an output buffer reused across calls silently rewrites what the caller already holds
        reused = first_copy is not None and not bitwise_equal(a.output, first_copy)
        self.log.event(event="case", stage="integrity", role="replay_second", case=second.to_json(),
                       label=second.label(), output=self.log.save(b.output), error=b.error, passed_as=inputs.mode,
                       obs=b.observations(), seconds=b.seconds, earlier_output_changed=reused)
        error = a.error or b.error
        if error:
            self.log.end("integrity", "fail", error)
            return False
        return self.passed("integrity", "observations recorded")


class CaseInputs(NamedTuple):
    placed: guards.Placed  # the judge's own tensors, in guarded buffers
    passed: list  # what kernel_fn is given: the same storage, as a model passes it
    kwargs: dict
    mode: str  # harness/correctness/as_passed.py's MODES


def refill(buffers: list, values: list) -> None:
    """Overwrite input buffers in place (same addresses, new contents); under inference_mode, where
    an inference tensor (an activation passed as one) may be written and a plain one too."""
    with torch.inference_mode():
        for dst, src in zip(buffers, values):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)


def run_stages(w: Worker, ns, network: dict | None = None) -> None:
    plan = w.plan()
    if plan is None:  # refused before import: the verdict still states the sandbox it would have had
        w.log.event(event="sandbox", **enter_sandbox(ns, network))
        return
    # calibrated before the sandbox and before the candidate exists in this process: nothing it
    # does can make the judge's own overhead look larger. The baselines are never timed here: a
    # clean worker times them (harness/workers/baseline.py); a candidate compiled only never runs
    if not w.compile_only:
        w.calibration = measurement.calibration(plan.timing, w.device, w.report)
        w.log.event(event="calibration", **w.calibration)
    prepare(w, ns, network)
    if not w.compile(plan) or not w.untouched("after compile"):
        return
    steps = [(s, lambda s=s: w.correctness_stage(s, plan.stages[s])) for s in ("smoke", "shape_sweep", "stability")]
    steps += [("determinism", lambda: w.determinism(plan.stages["determinism"])),
              ("edge_cases", lambda: w.correctness_stage("edge_cases", plan.stages["edge_cases"])),
              ("integrity", lambda: w.integrity(plan.stages["integrity"]))]
    for stage, run in steps:
        if not run() or not w.untouched(f"after {stage}"):
            return
    timing = time_candidate(w, plan.timing)
    if not w.untouched("after timing"):
        return
    if w.around is not None:
        around.time_around(w, plan.timing.dtype, timing, w.around.get("below_us"), time_candidate)
    if w.has_backward and timing is not None:  # gated apart: only a forward that passed here
        from harness.workers import backward_stages
        backward_stages.run(w, plan, timing)


def prepare(w: Worker, ns, network: dict | None = None) -> dict:
    """Everything between the worker's own imports and the candidate's import, in order: the OS
    sandbox, the watch on text reads, the identity snapshot, the audit hook. What the sandbox
    enforces is recorded and returned. (tests/rehearsal runs a first real launch behind exactly this.)"""
    state = enter_sandbox(ns, network)
    w.log.event(event="sandbox", **state)
    watch_text_reads()  # a tensor's repr counts as a host read: before the snapshot holds the wrappers
    w.guard = IdentityGuard(("__main__",))  # after every judge module is loaded, before the candidate
    install_audit_hook(ns, w, state)
    return state


def time_candidate(w: Worker, case: Case, stage: str = "timing", budget: dict | None = None):
    """Time kernel_fn at `case`, every timed call watched and its output recorded as a checked
    call's is (harness/timing/timed_calls.py), on fresh values every rep (harness/timing/fresh_inputs.py). The
    baselines are the clean worker's, put beside these figures by the judge; only the target's
    timing gets a second look. The kernel's TimedRun, or None when it raised."""
    w.log.start(stage)
    salt = w.noise.salt(stage)  # revealed in the stage's final record, after its last timed call
    key = w.noise.salt(f"{stage}:outputs")  # which outputs are saved, their checksums' key: revealed likewise
    target = stage == "timing"
    # the target's timed launches, each (kernel, programs, seconds, working programs): the verdict's
    # grid (grid_fill.py)
    w.monitor.grids = [] if target and w.device == "cpu" else None
    try:
        run = measurement.time_kernel(
            w.module.kernel_fn, case, w.device, w.report, w.monitor, w.log, stage,
            check=lambda: w.clocks_untouched("right after a timed call of kernel_fn"),
            phase=measurement.kernel_phase(stage), limits=budget,
            eager_median_us=w.eager_median_us if target else None, second_look=target, salt=salt, key=key)
    except Exception as e:
        w.log.end(stage, "fail", f"kernel_fn raised while being timed:\n{error_text(e)}")
        return None
    finally:
        grids, w.monitor.grids = w.monitor.grids, None
    problem = w.specializations_problem()
    if problem:
        w.log.end(stage, "fail", problem, noise_salt=salt)
        return None
    w.log.end(stage, "pass", "timed", case=case.to_json(), kernel=run.final.to_json(),
              rounds=[r.to_json() for r in run.rounds], second_look=run.second_look, noise_salt=salt,
              output_key=key, held_outputs={str(rep): name for rep, name in run.held_outputs.items()},
              **({"grid": grid_fill.heaviest(grids)} if grids is not None else {}))
    return run


def _target_compile():
    try:
        from harness.compiling import target_compile
    except ImportError:
        return None
    return target_compile


def _die_with_parent() -> None:
    """A judge killed with kill -9 cannot kill its worker; the kernel asks Linux to do it."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the judge's own timeout still applies
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def enter_sandbox(ns, network: dict | None = None) -> dict:
    """Confine this process before the candidate is imported: everything the worker itself needs
    (torch, Triton, the compile-for-target support) is imported first, while it may still write."""
    from harness.isolation import sandbox
    if ns.no_sandbox or not ns.sandbox_write:
        return sandbox.not_requested()
    import triton  # noqa: F401  (its first import reads its backends: before the rules, not under them)
    _target_compile()
    if ns.device == "cuda":
        torch.cuda.init()  # the driver opens its device files and shared memory before the rules
    state = sandbox.confine(ns.sandbox_write, namespace=network)
    from harness.correctness import candidate
    candidate.sandbox_active = state["kind"] == "landlock"
    return state


def install_audit_hook(ns, w: Worker, state: dict) -> None:
    """The audit hook, before the import (harness/isolation/audit_hook.py): never the worker's own records."""
    from harness.isolation import sandbox
    from harness.isolation.static_check import allowed_imports
    audit_policy.install_for_candidate(
        candidate_dir=str(w.path.parent), records_dir=str(ns.out_dir.resolve()), sandbox_write=ns.sandbox_write,
        reads=state.get("reads") or sandbox.read_roots(), allowed=allowed_imports(w.backend),
        report=w.report.refused if w.report else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.workers.worker")
    p.add_argument("kernel_file", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--target", default=None, help="a Case as JSON: the shapes and dtype to time")
    p.add_argument("--eager-median-us", type=float, default=None,
                   help="the clean worker's eager median at the target: when a first round gets a second look")
    p.add_argument("--sandbox-write", action="append", default=[], help="a folder the sandbox lets it write")
    p.add_argument("--no-sandbox", action="store_true", help="run the candidate without the OS sandbox")
    p.add_argument("--origin", default=None, help="the file the judge read the candidate from (never opened here)")
    p.add_argument("--time-around", default=None, help='also time the shapes around the target: {"below_us": '
                                                       'the target time it must beat first, or null}')
    p.add_argument("--backward", action="store_true", help="also judge the file's backward_fn (a training target)")
    p.add_argument("--witness", default=None, help="the judge's witness socket: every timed rep is reported there")
    ns = p.parse_args(argv)
    if ns.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("the judge's worker must run with TRITON_INTERPRET=1 on the CPU")
    _die_with_parent()
    report = Reporter(ns.witness) if ns.witness else None  # connected before the sandbox closes sockets
    # before any thread starts: a user namespace needs a single-threaded process
    network = None if ns.no_sandbox or not ns.sandbox_write else namespace.isolate_for(ns.device)
    target = Case.from_json(json.loads(ns.target)) if ns.target else None
    log = Log(ns.out_dir, report)
    log.event(event="started")
    worker = Worker(ns.kernel_file.resolve(), log, ns.device, ns.arch, target, ns.eager_median_us, report,
                    json.loads(ns.time_around) if ns.time_around else None)
    worker.judge_backward = ns.backward
    run_stages(worker, ns, network)
    log.event(event="done")
    return 0


if __name__ == "__main__":
    _code = main()
    # no interpreter shutdown after "done": the candidate's atexit handlers and finalizers would run
    # after the records are complete, free to rewrite them (the zygote's children end the same way)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
