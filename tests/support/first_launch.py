"""The child of tests/rehearsal: one place where a kernel first launches on a GPU, rehearsed on the
CPU behind the stand-in driver (standin_gpu.py). Each place is set up by its own code, exactly as on
a GPU (the sandbox, the audit hook, the launch monitor), then its kernels are loaded the way that
place loads them and called once with CPU tensors: a Triton kernel goes through Triton's real NVIDIA
backend to the stand-in's launch; a CUDA C++ kernel is built with nvcc and loaded, up to the call
that needs a device. Prints one JSON line:

    {"place": ..., "sandbox": "landlock" | ..., "calls": [{"name": ..., "error": null | "..."}]}

    python -m first_launch worker KERNEL_FILE SCRATCH          (the judge's worker)
    python -m first_launch workers KERNEL_FILE SCRATCH ...     (the judge's workers, forked: below)
    python -m first_launch kernelbench PROBLEM SOLUTION SCRATCH (the KernelBench child)
    python -m first_launch verify RUN_COPY SCRATCH             (verify's child)
    python -m first_launch export_check PACKAGE_PARENT SCRATCH (`export --selftest`'s child)
    python -m first_launch package PACKAGE_PARENT              (the exported package in a user's process)

SCRATCH is laid out as the judge lays out a judgement's (harness/judge.py): the caches beneath it,
TMPDIR and the cwd inside it; the parent sets the environment (standin_gpu.environment).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import standin_gpu

standin_gpu.fill_torch_queries()  # before anything asks: Triton's driver asks torch on its first use

import torch  # noqa: E402


def _error(e: BaseException) -> str:
    import traceback  # not the harness's own formatter: the package's place imports no project code
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]


def worker(kernel: Path, scratch: Path) -> dict:
    """The judge's worker (harness/workers/worker.py), set up for a GPU: its compile stage, which on a
    GPU makes the first call; a CUDA C++ kernel's first call follows its compile for the target."""
    from harness.correctness.candidate import observed_call
    from harness.isolation import namespace
    from harness.kernel_types import registry
    from harness.workers import worker as w_module
    out = scratch / "out"
    out.mkdir()
    ns = argparse.Namespace(device="cuda", sandbox_write=[str(scratch)], no_sandbox=False, out_dir=out)
    network = namespace.isolate_for("cuda")
    # tensors on the CPU (device "cpu" for the inputs); everything else as the GPU's worker does it
    w = w_module.Worker(kernel, w_module.Log(out), "cpu", "sm_90", None)
    plan = w.plan()
    state = w_module.prepare(w, ns, network)
    w.compile(plan)  # a CUDA C++ kernel's compile stage ends here on a CPU: compiled for the target
    end = [e for e in _events(out) if e.get("event") == "stage_end"][-1]
    calls = [{"name": kernel.name, "stage": "compile", "error": None if end["status"] == "pass" else end["detail"]}]
    if w.backend == "cuda" and w.module is not None:  # what a GPU's smoke stage does next
        args, kwargs = registry.build_inputs(plan.stages["smoke"][0], "cpu")
        result = observed_call(w.module.kernel_fn, args, kwargs, w.monitor)
        calls.append({"name": kernel.name, "stage": "first call", "error": result.error})
    return {"sandbox": state.get("kind"), "calls": calls}


def workers(*jobs: Path) -> dict:
    """The judge's workers as a judge session starts them (harness/workers/zygote.py): this process
    preloads what the judge's zygote preloads, with its own function, then forks one child per
    (KERNEL_FILE, SCRATCH) pair, one at a time; each child takes its judgement's environment after
    the fork (TMPDIR and its own compiler caches in its scratch, forkserver.PER_CALL_ENV), its cwd,
    and does what `worker` does, writing its JSON line and its stderr to SCRATCH/result.json and
    SCRATCH/stderr. Nothing is compiled, launched or confined here: each child makes its kernel's
    first launch and builds Triton's launcher support itself, into caches no other child reads."""
    from harness.workers import zygote
    zygote.preload()
    status = {}
    for kernel, scratch in zip(jobs[::2], jobs[1::2]):
        pid = os.fork()
        if pid == 0:
            _forked_worker(kernel, scratch)
        status[kernel.name] = _wait(pid, time.monotonic() + CHILD_TIMEOUT_S)
    return {"sandbox": None, "calls": [], "exit": status}


CHILD_TIMEOUT_S = 600  # each forked worker's, as the rehearsal's spawned worker has (rehearsal.TIMEOUT_S)


def _wait(pid: int, deadline: float) -> int:
    """The child's exit code; past the deadline its process group is killed (-9)."""
    import signal
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _forked_worker(kernel: Path, scratch: Path) -> None:
    """In the forked child: the worker of one judgement; never returns."""
    import tempfile
    from harness.isolation.sandbox import private_caches
    code = 1
    try:
        os.setsid()
        for fd, name in ((1, "result.json"), (2, "stderr")):
            target = os.open(scratch / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        os.chdir(scratch / "cwd")
        sys.path[0] = str(scratch / "cwd")  # what `python -m` puts first, as the zygote's child has it
        os.environ.update({"TMPDIR": str(scratch / "tmp"), **private_caches(scratch)})
        tempfile.tempdir = None  # re-read TMPDIR: the child's scratch folder, not the parent's
        import triton
        print(json.dumps({"place": "worker", "triton": triton.__version__, **worker(kernel, scratch)},
                         default=str), flush=True)
        code = 0
    except BaseException:  # noqa: BLE001 - a child must never return into the parent's loop
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def kernelbench(problem: Path, solution: Path, scratch: Path) -> dict:
    """The KernelBench child (harness/kernelbench/kb_worker.py) checking a solution: its set-up, then
    ModelNew built and called once on the problem's inputs."""
    from harness.correctness.candidate import observed_call
    from harness.correctness import launches
    from harness.isolation import namespace
    from harness.kernelbench import kb_worker
    from harness.kernelbench.kb_protocol import Bench, forward, trial_seeds
    out = scratch / "out"
    out.mkdir()
    a = argparse.Namespace(problem=str(problem), solution=str(solution), out=out, device="cuda",
                           sandbox_write=[str(scratch)], no_sandbox=False, report=None)
    network = namespace.isolate_for("cuda")
    bench = Bench(str(problem), "cpu", "fp32")
    a.model = bench.build(bench.Model)
    state, _ = kb_worker.prepare(a, network)
    monitor = launches.install()
    try:
        new, _ = kb_worker.load_candidate(bench, a.solution, out, a.model)
    except BaseException as e:  # noqa: BLE001 - what stopped the load is the finding
        return {"sandbox": state.get("kind"), "calls": [{"name": solution.name, "error": _error(e)}]}
    seed = trial_seeds(1)[0]
    call = observed_call(lambda *x: forward(new, list(x), seed), bench.inputs(seed), {}, monitor)
    return {"sandbox": state.get("kind"), "calls": [{"name": solution.name, "error": call.error}]}


def verify(run: Path, scratch: Path) -> dict:
    """verify's child (autokernel/deploy/verify_child.py) on a copy of a run: its confinement, then the
    winners loaded as verify loads them and each called once, as served, at its target."""
    from autokernel.deploy import verify_child, winners
    from autokernel.search.run import RunDir
    ns = argparse.Namespace(run=str(run), device="cuda", sandbox_write=[str(scratch)], no_sandbox=False)
    state = verify_child.confine(ns)
    files = winners.winner_files(RunDir(run))
    loaded, skipped = winners.load_winners(files)
    calls = [{"name": name, "error": f"not loaded: {why}"} for name, why in skipped.items()]
    for winner in loaded:
        calls.append({"name": winner.target, "error": _served(winner.kernel_fn, winner.kernel_type, winner.dims,
                                                              winner.dtype, winner.kwargs)})
    return {"sandbox": state.get("kind"), "calls": calls}


def _served(kernel_fn, kernel_type: str, dims: dict, dtype: str, kwargs: dict) -> str | None:
    from harness.kernel_types.registry import Case, build_inputs
    args, kw = build_inputs(Case.make(kernel_type, dims, dtype, seed=7, **kwargs), "cpu")
    try:
        kernel_fn(*args, **kw)
    except BaseException as e:  # noqa: BLE001 - KernelRefused is a BaseException: the finding itself
        return _error(e)
    return None


def export_check(parent: Path, scratch: Path) -> dict:
    """`export --selftest`'s child (autokernel/deploy/export_check.py): its confinement, then every
    kernel of the package loaded as its selftest loads them and called once at its target."""
    from autokernel.deploy import export_check as check
    ns = argparse.Namespace(package_parent=str(parent), package=check.PACKAGE, device="cuda",
                            sandbox_write=[str(scratch)], no_sandbox=False)
    package, failure, state = check.confine(ns)
    if failure is not None:
        return {"sandbox": state.get("kind"), "calls": [{"name": "the package", "error": failure}]}
    return {"sandbox": state.get("kind"), "calls": _package_calls(package)}


def _package_calls(package) -> list[dict]:
    calls = []
    for winner in package.winners():
        calls.append({"name": winner.target, "error": _served(winner.kernel_fn, winner.kernel_type, winner.dims,
                                                              winner.dtype, winner.kwargs)})
    calls += [{"name": target, "error": f"unavailable: {why}"} for target, why in package.UNAVAILABLE.items()]
    return calls


def package(parent: Path, model_file: Path) -> dict:
    """The exported package in a plain user process, its audit hook on: the unmodified model of
    tests/data/branches.py patched and run once, every call its winners serve a first launch."""
    import importlib.util
    sys.path.insert(0, str(parent))
    import autokernel_kernels as ak
    spec = importlib.util.spec_from_file_location("user_model", model_file)
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    torch.manual_seed(0)
    model = user.Branches().eval()
    try:
        with torch.inference_mode(), ak.patch(model) as router:
            model(torch.randn(1, 8, 32))
    except BaseException as e:  # noqa: BLE001 - a refused event in a served call raises KernelRefused
        return {"sandbox": "none (a user's process)", "calls": [{"name": "patch", "error": _error(e)}]}
    tally = router.tally.to_json()["per_kernel"]
    calls = [{"name": target, "served": k.get("calls_served", 0), "fallbacks": k.get("fallbacks", {}),
              "error": None if k.get("calls_served") else f"served no call: {k}"} for target, k in tally.items()]
    return {"sandbox": "none (a user's process)", "guard": ak._guarded[:], "calls": calls}


def main(argv: list[str]) -> int:
    place, *rest = argv
    paths = [Path(p).resolve() for p in rest]
    places = {"worker": worker, "workers": workers, "kernelbench": kernelbench, "verify": verify, "export_check": export_check,
              "package": package}
    result = places[place](*paths)
    import triton
    print(json.dumps({"place": place, "triton": triton.__version__, **result}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the judge's children end: no finalizers of kernel code after the result
