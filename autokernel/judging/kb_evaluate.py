"""Judging a ModelNew against a KernelBench problem's Model: the parent side.

Four kinds of child process (harness/kernelbench/kb_worker.py), each isolated (own process group, deadline,
scrubbed environment):
  reference  Model alone: trial outputs, eager timing, Model's own ops, FLOPs and bytes. Run once
             per problem and kept in a `RefCache`; it never imports a solution, so a solution can
             neither read the expected outputs nor slow the baseline down.
  check      ModelNew on the same five trials (KernelBench's seeds) plus a replay probe.
  time       ModelNew timed (only once it passed), with its first and last timed outputs.
  compile    torch.compile(Model) timed, under its own deadline; null with the reason on failure.
Outputs come back as tensors (loaded with weights_only) and are compared here, with this
process's torch.allclose, which no solution code has touched.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autokernel.errors import UsageError
from autokernel.judging import kb_checks as checks
from autokernel.judging.kb_problems import check_problem_file, check_solution_file, problem_from_file

DEFAULT_REPS = {"cuda": 100, "cpu": 10}  # KernelBench times 100 trials; the interpreter is slow
STAGES = ("load", "correctness", "integrity", "timing")
STAGE_NAMES = {"load_problem": "load", "load": "load", "correctness": "correctness", "replay": "integrity",
               "timing": "timing", "compile": "timing", "reference": "reference"}


@dataclass(frozen=True)
class EvalOptions:
    device: str = "cpu"
    precision: str = "fp32"
    trials: int = 5
    reps: int | None = None  # None: DEFAULT_REPS for the device
    warmup: int = 3
    timeout_s: float = 300.0  # per child process
    compile_baseline: bool = True
    compile_timeout_s: float | None = None  # None: max(timeout_s, 300)
    sandbox: bool = True  # False only on explicit request: the solution then runs with the user's rights
    visible_devices: str | None = None  # the CUDA index a judge slot pins the children to (None: all)

    @property
    def n_reps(self) -> int:
        return self.reps or DEFAULT_REPS[self.device]

    @property
    def tolerance(self) -> float:
        return checks.TOLERANCES[self.precision]


@dataclass(frozen=True)
class Solution:
    """The solution's text as read once by the parent: what is judged, hashed and copied to children."""
    path: Path
    text: str
    caches: str | None = None  # this solution's own compiler caches, shared by its children only

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass
class ChildRun:
    result: dict | None
    tensors: dict
    stage: str
    returncode: int | None
    timed_out: bool
    signal: str | None
    stderr_tail: str
    seconds: float
    sandbox: dict | None = None  # what the child enforced, as it recorded before running the solution
    witnessed: Any = None  # harness/timing/witness.py's Record: the timed reps on the judge's clock, refusals
    started_by: str = "spawn"  # "fork": from the judge session's pre-imported worker

    def outputs(self, key: str) -> list:
        return outputs_of(self.tensors, key)


def outputs_of(tensors: dict, key: str) -> list:
    """The tensors a child stored as key.0, key.1, ... (one per output of forward)."""
    n = sum(1 for k in tensors if k.rsplit(".", 1)[0] == key)
    return [tensors[f"{key}.{k}"] for k in range(n)]


def run_child(mode: str, problem: Path, opts: EvalOptions, solution: Solution | None = None,
              timeout_s: float | None = None) -> ChildRun:
    """One child; a solution's child imports a copy of the text the parent read, from its own
    scratch folder, inside the OS sandbox (writes only there and to the compiler caches)."""
    import torch
    from harness.judge import child_env, sandbox_argv
    from harness.workers.judge_session import run_module
    from harness.isolation.sandbox import private_caches
    from harness.timing.witness import Witness
    witness = Witness() if solution is not None else None
    with tempfile.TemporaryDirectory(prefix="ak-kb-") as tmp:
        out, cwd, scratch_tmp = Path(tmp, "out"), Path(tmp, "cwd"), Path(tmp, "tmp")
        for folder in (out, cwd, scratch_tmp):
            folder.mkdir()
        argv = [mode, "--problem", str(problem.resolve()),
                "--out", str(out), "--device", opts.device, "--precision", opts.precision,
                "--trials", str(opts.trials), "--reps", str(opts.n_reps), "--warmup", str(opts.warmup)]
        env = child_env(opts.device, opts.visible_devices)
        if solution is not None:
            copy = Path(tmp, "src", solution.path.name)
            copy.parent.mkdir()
            copy.write_text(solution.text, encoding="utf-8")
            argv += ["--solution", str(copy)]
            argv += sandbox_argv(Path(tmp), extensions=True) if opts.sandbox else ["--no-sandbox"]
            argv += ["--witness", str(witness.path)]
            env["TMPDIR"] = str(scratch_tmp)
            # the solution's own compiler caches: what one solution builds no other one loads
            cache_root = Path(solution.caches) if solution.caches else Path(tmp)
            env.update(private_caches(cache_root))
            if opts.sandbox and solution.caches:
                argv += ["--sandbox-write", str(Path(solution.caches, "caches"))]
        try:
            # forked from the judge session's pre-imported worker where there is one, else spawned
            child, started_by = run_module("harness.kernelbench.kb_worker", argv, timeout_s or opts.timeout_s, env, cwd, out,
                                  restart=witness.reset if witness is not None else None)
        finally:
            witnessed = witness.close() if witness is not None else None
        result_path, tensors_path, stage_path = out / "result.json", out / "tensors.pt", out / "stage"
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        # weights_only: the file may come from a solution's process; it must not carry code
        tensors = torch.load(tensors_path, weights_only=True) if result and tensors_path.exists() else {}
        stage = stage_path.read_text() if stage_path.exists() else "start"
        sandbox = _read_json(out / "sandbox.json")
    return ChildRun(result, tensors, stage, child.returncode, child.timed_out, child.signal_name,
                    child.stderr_tail(), child.seconds, sandbox, witnessed, started_by)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Reference:
    result: dict
    tensors: dict
    compiled: dict | None = None  # {"timing": ...} or {"timing": None, "note": why}

    def outputs(self, key: str) -> list:
        return outputs_of(self.tensors, key)


@dataclass
class RefCache:
    """Model's results per (problem source, options), computed once and kept in this process's
    memory (never on disk, where a solution could rewrite them). Judge slots (--workers) share one:
    its lock makes the first of them compute a problem's reference and the others wait for it."""
    entries: dict[str, Reference] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def _key(self, problem: Path, opts: EvalOptions) -> str:
        digest = hashlib.sha256(problem.read_bytes()).hexdigest()
        return f"{digest}:{opts.device}:{opts.precision}:{opts.trials}:{opts.n_reps}:{opts.warmup}"

    def reference(self, problem: Path, opts: EvalOptions) -> Reference:
        with self.lock:
            return self._reference(problem, opts)

    def _reference(self, problem: Path, opts: EvalOptions) -> Reference:
        key = self._key(problem, opts)
        if key not in self.entries:
            run = run_child("reference", problem, opts)
            if run.result is None or "problem_error" in run.result:
                why = (run.result or {}).get("problem_error") or _death(run, "reference", opts.timeout_s)
                raise UsageError(f"the problem {problem} does not run on its own: {why}",
                                 "fix the problem file; no solution was judged")
            self.entries[key] = Reference(run.result, run.tensors)
        return self.entries[key]

    def compiled(self, problem: Path, opts: EvalOptions) -> dict:
        with self.lock:
            return self._compiled(problem, opts)

    def _compiled(self, problem: Path, opts: EvalOptions) -> dict:
        ref = self._reference(problem, opts)
        if ref.compiled is None:
            limit = opts.compile_timeout_s or max(opts.timeout_s, 300.0)
            run = run_child("compile", problem, opts, timeout_s=limit)
            if run.result and "timing" in run.result:
                ref.compiled = {"timing": run.result["timing"], "compile_s": run.result.get("compile_s")}
            else:
                why = (run.result or {}).get("error") or _death(run, "torch.compile", limit)
                ref.compiled = {"timing": None, "note": f"torch.compile baseline unavailable: {why}"}
        return ref.compiled


def _death(run: ChildRun, what: str, timeout_s: float, tail: bool = True) -> str:
    if run.timed_out:
        return f"{what} took longer than {timeout_s:.0f} s (during {run.stage})"
    how = run.signal or f"exit status {run.returncode}"
    return f"{what} died ({how}) during {run.stage}" + (f":\n{run.stderr_tail}" if tail and run.stderr_tail else "")


# ------------------------------------------------------------------------------ the verdict
class Verdict:
    """Accumulates the JSON verdict; `end` fixes the outcome once."""

    def __init__(self, problem: Path, solution: Path, opts: EvalOptions):
        p = problem_from_file(problem)
        self.data: dict[str, Any] = {
            "problem": str(problem), "problem_key": p.key, "level": p.level, "problem_id": p.problem_id,
            "solution": str(solution), "correct": False, "verdict": "FAIL", "failed_stage": None,
            "reason": "", "speedup_vs_eager": None, "speedup_vs_compile": None, "flags": [], "notes": [],
            "trials": [], "integrity": {}, "timing": None, "roofline": None, "precision": opts.precision,
            "tolerance": opts.tolerance, "device": {"type": opts.device}, "versions": {}}

    def end(self, verdict: str, stage: str | None, reason: str) -> dict:
        self.data.update(verdict=verdict, failed_stage=stage, reason=reason, correct=verdict == "PASS")
        reached = STAGES.index(stage) if stage in STAGES else len(STAGES)
        self.data["stages"] = [{"name": name, "status": "pass" if i < reached else "fail" if i == reached else "skip",
                                "detail": reason if i == reached else ""} for i, name in enumerate(STAGES)]
        return self.data

    def child_failed(self, run: ChildRun, opts: EvalOptions) -> dict | None:
        """The end of the verdict if the child hung, died or reported the solution's exception."""
        stage = STAGE_NAMES.get(run.stage, run.stage)
        if run.timed_out:
            self.data["stderr_tail"] = run.stderr_tail
            return self.end("TIMEOUT", stage, f"no result after {opts.timeout_s:.0f} s during {run.stage}; "
                                              "the child's whole process group was killed")
        if run.result is None:
            self.data["stderr_tail"] = run.stderr_tail
            return self.end("CRASH", stage, _death(run, "the solution's process", opts.timeout_s, tail=False)
                            + "; its stderr is in stderr_tail")
        if "error" in run.result or "problem_error" in run.result:
            stage = STAGE_NAMES.get(run.result.get("stage", run.stage), "load")
            return self.end("FAIL", stage, run.result.get("error") or run.result["problem_error"])
        return None


def evaluate(problem: str | Path, solution: str | Path, options: EvalOptions | None = None,
             cache: RefCache | None = None) -> dict:
    """Judge `solution` (a ModelNew file) against `problem`; always returns the verdict dict. Its
    children fork from one pre-imported worker: the caller's judge session, or one of its own."""
    from harness.workers.judge_session import judge_session
    with judge_session(), tempfile.TemporaryDirectory(prefix="ak-kb-caches-") as caches:
        return _evaluate(Path(problem), Path(solution), options, cache, caches)


def _evaluate(problem: Path, solution: Path, options: EvalOptions | None, cache: RefCache | None,
              caches: str | None = None) -> dict:
    opts = resolve(options or EvalOptions())
    check_problem_file(problem)
    check_solution_file(solution)
    cache = cache if cache is not None else RefCache()
    v = Verdict(problem, solution, opts)
    ref = cache.reference(problem, opts)
    v.data.update(device=ref.result["device"], versions=ref.result["versions"])
    sol = Solution(solution, solution.read_text(encoding="utf-8", errors="replace"), caches)
    v.data["source_sha256"] = sol.sha256
    v.data["flags"] += checks.source_flags(sol.text)
    if (ended := _static_check(v, sol)) is not None:
        return ended
    check = run_child("check", problem, opts, sol)
    v.data["sandbox"] = _sandbox_of(check, opts)
    v.data["workers"] = {"check": check.started_by}
    if (ended := v.child_failed(check, opts) or _tampered(v, check) or _refused(v, check)) is not None:
        return ended
    for step in (_judge_trials, _judge_integrity):
        if (ended := step(v, ref, check, opts)) is not None:
            return ended
    timed = run_child("time", problem, opts, sol)
    v.data["workers"]["time"] = timed.started_by
    if (ended := v.child_failed(timed, opts) or _tampered(v, timed) or _refused(v, timed)
            or _judge_timed_ops(v, check, timed) or _judge_timed_outputs(v, ref, timed, opts)
            or _witnessed(v, timed, opts.n_reps)) is not None:
        return ended
    _speedups(v, ref, timed, opts, cache.compiled(problem, opts) if opts.compile_baseline else None)
    return v.end("PASS", None, "correct on every trial; integrity checks passed")


def _static_check(v: Verdict, sol: Solution) -> dict | None:
    """A solution that imports or touches more than a ModelNew needs is refused before any import."""
    from harness.isolation.static_check import check_source, describe
    try:
        violations = check_source(sol.text, model=True, filename=sol.path.name)
    except SyntaxError:
        return None  # the child reports the syntax error as the solution's failure to load
    return v.end("FAIL", "load", describe(violations, sol.path.name)) if violations else None


def _sandbox_of(run: ChildRun, opts: EvalOptions) -> dict:
    from harness.isolation.sandbox import not_requested, warn_if_open
    state = run.sandbox or (run.result or {}).get("sandbox") or (
        not_requested() if not opts.sandbox else {"kind": "none", "reason": "the child reported no sandbox"})
    warn_if_open(state, "the KernelBench child")
    return state


def _tampered(v: Verdict, run: ChildRun) -> dict | None:
    """The child's identity check of its clocks and functions: a replacement fakes the time."""
    from harness.isolation.tamper import describe
    identity = (run.result or {}).get("identity")
    if identity is None:
        return v.end("FAIL", "integrity", "the solution's process did not confirm its clocks and checks")
    if identity.get("replaced"):
        return v.end("FAIL", "integrity", describe(identity["replaced"], identity.get("where", "")))
    return None


def _refused(v: Verdict, run: ChildRun) -> dict | None:
    """What the audit hook refused in the solution's process, even where the solution carried on."""
    refusals = run.witnessed.refusals if run.witnessed is not None else []
    if not refusals:
        return None
    more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
    return v.end("FAIL", "integrity", refusals[0] + more)


def _witnessed(v: Verdict, timed: ChildRun, null_reps: int) -> dict | None:
    """ModelNew's timing held to the judge's own clock, rep by rep (harness/timing/witness.py). The
    baselines are timed in children that never import a solution (reference, compile): a baseline
    line, or a null-call rep past the planned `null_reps`, on the solution's channel is a forgery."""
    from harness.kernelbench.kb_protocol import MODEL_PHASE
    from harness.timing.timer import summary
    from harness.timing.witness import agreement, baseline_line, disagreement_text
    w = timed.witnessed
    null = w.reps("null") if w is not None else None
    forged = (baseline_line(w) if w is not None else None) or (
        f"{len(null.samples_us)} null-call reps where the judge planned {null_reps}"
        if null is not None and len(null.samples_us) != null_reps else None)
    if forged:
        return v.end("FAIL", "integrity", f"the witness of the timing: {forged}")
    reps = w.reps(MODEL_PHASE) if w is not None else None
    if w is None or w.problem or reps is None or not reps.samples_us:
        why = (w.problem if w is not None else None) or "the timed reps were not reported to the judge as they ended"
        return v.end("FAIL", "integrity", f"the witness of the timing: {why}")
    if reps.samples_us != timed.result["timing"].get("samples_us"):
        return v.end("FAIL", "integrity", "the solution's timing record differs from the reps it reported "
                                          "to the judge as they ended")
    check = agreement(reps, w.reps("null"))
    if not check["agrees"]:
        return v.end("FAIL", "integrity", disagreement_text(check))
    timed.result["timing"] = {**summary(reps.samples_us, str(v.data["device"].get("type", "cpu"))).to_json(),
                              "witness": check}
    return None


def resolve(opts: EvalOptions) -> EvalOptions:
    from harness.judge import JudgeUsageError, resolve_device
    try:
        device = resolve_device(opts.device)
    except JudgeUsageError as e:
        raise UsageError(str(e)) from e
    if opts.precision not in checks.TOLERANCES:
        raise UsageError(f"unknown precision {opts.precision!r}", "use fp32, fp16 or bf16")
    if opts.trials < 2:
        raise UsageError("at least 2 correctness trials are needed (the replay probe uses two)")
    return replace(opts, device=device)


def _judge_trials(v: Verdict, ref: Reference, check: ChildRun, opts: EvalOptions) -> dict | None:
    tol, ref_trials = opts.tolerance, ref.result["trials"]
    refs = [ref.outputs(f"trial{t}") for t in range(len(ref_trials))]
    fixed = checks.fixed_output_passes(refs, tol)
    results = []
    for t, (want, got) in enumerate(zip(ref_trials, check.result["trials"])):
        if want["fingerprint"] != got["fingerprint"]:
            return v.end("FAIL", "correctness", f"trial {t}: the solution's process built other inputs than "
                         "the reference's (get_inputs() not deterministic under torch.manual_seed, or the "
                         "solution changed the RNG or get_inputs)")
        passed, max_err, detail = checks.compare(refs[t], check.outputs(f"trial{t}"), tol)
        trivial = "a fixed output" if fixed else checks.trivial_output(refs[t], tol)
        # a trial that zeros or a constant would pass is no evidence of correctness
        results.append(checks.TrialCheck(t, want["seed"], passed, trivial is None, max_err,
                                         detail + (f"; not counted: {trivial} passes it" if trivial else "")))
    v.data["trials"] = [r.to_json() for r in results]
    order = next((t["program_order"][0] for t in check.result["trials"] if t.get("program_order")), None)
    if order:  # a launch whose programs read what others of it wrote: right in the interpreter's id order only
        return v.end("FAIL", "correctness", order)
    if any(o.get("sampled") for t in ref_trials for o in t["outputs"]):
        v.data["notes"].append("outputs above 2**25 elements were compared on a strided sample")
    failed = [r for r in results if not r.passed]
    if failed:
        return v.end("FAIL", "correctness", f"{len(failed)} of {len(results)} trials wrong; first: "
                                            f"trial {failed[0].index}: {failed[0].detail}")
    if not any(r.counted for r in results):
        return v.end("FAIL", "correctness", "no trial counts: an output that ignores the inputs (zeros or "
                     "a constant) passes every trial at this tolerance, so passing them shows nothing")
    return None


def _judge_integrity(v: Verdict, ref: Reference, check: ChildRun, opts: EvalOptions) -> dict | None:
    trials = check.result["trials"]
    launches = sum(t["launches"] for t in trials)
    failure, flags = checks.ops_policy(check.result["pytorch_ops"], ref.result["model_ops"], launches)
    v.data["integrity"] = {"launches_per_trial": [t["launches"] for t in trials],
                           "pytorch_ops": check.result["pytorch_ops"], "model_ops": ref.result["model_ops"],
                           "state_copied": check.result["state"]}
    v.data["flags"] += flags
    if any(t["launches"] == 0 for t in trials) and launches:
        v.data["flags"].append("some trials launched no custom kernel")
    if any(t["device_to_host"] for t in trials):
        v.data["flags"].append("copies device tensors to the host during forward")
    if failure is None and not all(t["plain"] for t in trials):
        # blocks a tensor subclass or lazy object that could change its values after the check
        failure = "the output is not a plain torch.Tensor"
    if failure is None and any(t["device"] and t["device"].split(":")[0] != opts.device for t in trials):
        # blocks computing on the host and handing back a host tensor
        failure = f"the output is not on the {opts.device} device"
    if failure is None and any(t["mutated"] for t in trials) and not ref.result["mutates_input"]:
        # blocks scribbling results (or scratch) into the caller's inputs
        failure = "ModelNew writes into its inputs (Model does not)"
    if failure is None and any(t["aliased"] for t in trials) and not ref.result["aliases_input"]:
        # blocks handing back an input's storage, which changes when the caller reuses the input
        failure = "the output shares storage with an input (Model's does not)"
    if failure is None:
        # blocks a replay/result cache: the trial-0 buffers refilled in place with trial 1's values
        ok, _, detail = checks.compare(ref.outputs("trial1"), check.outputs("refill"), opts.tolerance)
        if not ok:
            failure = ("after its input buffers were refilled in place with new values, ModelNew returned "
                       f"a wrong result (a result cache keyed on buffers?): {detail}")
    return v.end("FAIL", "integrity", failure) if failure else None


def _judge_timed_ops(v: Verdict, check: ChildRun, timed: ChildRun) -> dict | None:
    # blocks a solution that computes with PyTorch only when timed (told apart by a call count)
    more = sorted(set(timed.result.get("timed_ops", [])) - set(check.result.get("pytorch_ops", [])))
    if more:
        return v.end("FAIL", "timing", f"ModelNew ran PyTorch compute when timed that none of its checked calls "
                                       f"ran: {', '.join(more[:6])}")
    return None


def _judge_timed_outputs(v: Verdict, ref: Reference, timed: ChildRun, opts: EvalOptions) -> dict | None:
    # blocks caches that switch on after the correctness calls, and answers right only when checked:
    # every timed rep whose output both children kept, on the same values, must fit its inputs
    ends = {"0", str(opts.n_reps - 1)}  # always on their own seeds in both children
    compared = 0
    for rep, fp in sorted(ref.result["checked_reps"].items(), key=lambda kv: int(kv[0])):
        mine = timed.result["fingerprints"].get(rep)
        if mine != fp or not timed.outputs(f"rep{rep}"):
            if rep in ends:
                return v.end("FAIL", "timing", f"timed rep {rep} ran on other inputs than the reference's")
            continue  # a rep a pool of values served differently in the two children: not comparable
        ok, _, detail = checks.compare(ref.outputs(f"rep{rep}"), timed.outputs(f"rep{rep}"), opts.tolerance)
        if not ok:
            return v.end("FAIL", "timing", f"timed rep {rep} returned a wrong result for the inputs it was "
                                           f"given (a cache that switches on when timed?): {detail}")
        compared += 1
    v.data["timed_reps_checked"] = compared
    return None


def _speedups(v: Verdict, ref: Reference, timed: ChildRun, opts: EvalOptions, compiled: dict | None) -> None:
    mine, eager = timed.result["timing"], ref.result["timing"]
    comp = (compiled or {}).get("timing")
    if compiled is None:
        v.data["notes"].append("torch.compile baseline not requested")
    elif comp is None:
        v.data["notes"].append(compiled["note"])
    speed = {"eager": eager["median_us"] / mine["median_us"] if mine["median_us"] > 0 else None,
             "compile": comp["median_us"] / mine["median_us"] if comp and mine["median_us"] > 0 else None}
    v.data.update(speedup_vs_eager=speed["eager"], speedup_vs_compile=speed["compile"])
    # the solution's figures on top (as in every verdict of this project), the baselines nested
    v.data["timing"] = {**mine, "baseline_median_us": eager["median_us"], "speedup_vs_eager": speed["eager"],
                        "compile_median_us": comp["median_us"] if comp else None,
                        "speedup_vs_compile": speed["compile"], "eager": eager, "compile": comp,
                        "fresh_input_sets": timed.result.get("fresh_sets"),
                        "host_wall_median_us": timed.result.get("host_wall_median_us")}
    v.data["flags"] += checks.speed_flags(speed)
    v.data["flags"] += checks.stream_flag(mine["median_us"], timed.result.get("host_wall_median_us"))
    roof = checks.roofline(mine["median_us"], ref.result["flops"], ref.result["bytes"],
                           ref.result.get("peaks"), opts.precision)
    v.data["roofline"] = roof
    if roof and roof["below_bound"]:
        v.data["flags"].append(f"{mine['median_us']:.2f} us is below the roofline bound "
                               f"({roof['bound_us']:.2f} us): faster than the device can be")
    if not mine["representative_of_gpu"]:
        v.data["notes"].append("CPU timings (Triton interpreter): not representative of a GPU")

def judge_file(kernel_file: Path, *, problem: Path, opts: EvalOptions, cache: RefCache,
               visible_devices: str | None = None, **_: Any) -> dict:
    """The loop's judge: a candidate without ModelNew is its failure, not the run's. A judge slot
    on one GPU of several passes `visible_devices`: the solution's children run on that GPU."""
    try:
        check_solution_file(kernel_file)
    except UsageError as e:
        return {"verdict": "FAIL", "failed_stage": "load", "correct": False, "usage_error": e.message,
                "stages": [{"name": "load", "status": "fail", "detail": e.message}], "timing": None}
    if visible_devices is not None:
        opts = replace(opts, visible_devices=str(visible_devices))
    return evaluate(problem, kernel_file, opts, cache)
