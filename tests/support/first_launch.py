"""The child of tests/rehearsal: one place where a kernel first launches on a GPU, rehearsed on the
CPU behind the stand-in driver (standin_gpu.py). Each place is set up by its own code, exactly as on
a GPU (the sandbox, the audit hook, the launch monitor), then its kernels are loaded the way that
place loads them and called once with CPU tensors: a Triton kernel goes through Triton's real NVIDIA
backend to the stand-in's launch; a CUDA C++ kernel is built with nvcc and loaded, up to the call
that needs a device. Prints one JSON line:

    {"place": ..., "sandbox": "landlock" | ..., "calls": [{"name": ..., "error": null | "..."}]}

    python -m first_launch worker KERNEL_FILE SCRATCH          (the judge's worker)
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
import sys
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
    places = {"worker": worker, "kernelbench": kernelbench, "verify": verify, "export_check": export_check,
              "package": package}
    result = places[place](*paths)
    import triton
    print(json.dumps({"place": place, "triton": triton.__version__, **result}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    import os
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the judge's children end: no finalizers of kernel code after the result
