"""The helpers of tests/rehearsal: a first real launch rehearsed on the CPU in a fresh process
(tests/support/first_launch.py) behind the stand-in driver (standin_gpu.py); docs/gpus.md says what
is rehearsed and what only a device proves."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import standin_gpu



def starters(backend: str) -> list[str]:
    """Every kernel type with a starter for `backend`: each one's first launch is rehearsed."""
    from starter_kernels import KERNEL_TYPES, starter_path
    found = []
    for kernel_type in KERNEL_TYPES:
        try:
            starter_path(kernel_type, backend)
        except KeyError:
            continue
        found.append(kernel_type)
    return found

NEEDS_A_DEVICE = "a CUDA kernel needs tensors on a CUDA device"  # harness/cuda_launcher.py, past build and load
REFUSED = ("refused by the judge", "Permission denied", "KernelRefused")
TIMEOUT_S = 600


def scratch(folder: Path) -> tuple[Path, dict]:
    """A scratch folder laid out as the judge lays out a judgement's (harness/judge.py), and the
    environment the judge gives a GPU child there."""
    from harness.isolation.process import child_env
    from harness.isolation.sandbox import private_caches
    for name in ("src", "cwd", "tmp"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    return folder, {**child_env("cuda"), "TMPDIR": str(folder / "tmp"), **private_caches(folder)}


def rehearse(place: str, args: list, env: dict, cwd: Path, timeout_s: float = TIMEOUT_S) -> tuple[dict, list[str], str]:
    """Run one place in a fresh process (tests/support/first_launch.py): its result, the kernels the
    stand-in launched, its stderr."""
    proc = subprocess.run([sys.executable, "-m", "first_launch", place, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, standin_gpu.launches_told(proc.stderr), proc.stderr


def judge_worker(driver: Path, kernel: Path, folder: Path, triton: Path | None = None,
                 path_first: Path | None = None) -> tuple[dict, list[str], str]:
    """The judge's worker set up for a GPU, its compile stage on `kernel` (a copy in its scratch)."""
    root, base = scratch(folder)
    copy = root / "src" / kernel.name
    copy.write_bytes(kernel.read_bytes())  # the judge imports a copy from its scratch, never the file
    env = standin_gpu.environment(base, driver, triton, path_first)
    return rehearse("worker", [copy, root], env, root / "cwd")


def forked_judge_workers(driver: Path, kernels: list[Path], folder: Path,
                         triton: Path | None = None) -> dict[str, tuple[dict, list[str], str]]:
    """The judge's workers set up for a GPU as a judge session starts them, forked one per kernel
    from a process that preloaded what the judge's zygote preloads (first_launch.workers): each
    one's compile stage on its kernel (a copy in a scratch of its own, with its own caches), by the
    kernel's file name; each result carries the child's exit status (assert_launched checks it)."""
    jobs, scratches = [], {}
    for kernel in kernels:
        root, _ = scratch(folder / kernel.stem)
        copy = root / "src" / kernel.name
        copy.write_bytes(kernel.read_bytes())  # the judge imports a copy from its scratch, never the file
        jobs += [copy, root]
        scratches[kernel.name] = root
    parent, base = scratch(folder / "parent")  # the zygote's own: no child reads its caches
    result, _, _ = rehearse("workers", jobs, standin_gpu.environment(base, driver, triton), parent / "cwd",
                            timeout_s=TIMEOUT_S * len(kernels))  # each child has its own TIMEOUT_S
    found = {}
    for name, root in scratches.items():
        stderr = (root / "stderr").read_text()
        lines = (root / "result.json").read_text().strip().splitlines()
        told = json.loads(lines[-1]) if lines else {}
        found[name] = {"exit": result["exit"][name], **told}, standin_gpu.launches_told(stderr), stderr
    return found


def assert_launched(result: dict, launched: list[str], stderr: str) -> None:
    assert result.get("exit", 0) == 0 and "calls" in result, f"the worker did not finish:\n{stderr[-4000:]}"
    assert result["sandbox"] == "landlock", result
    for call in result["calls"]:
        assert call["error"] is None, call["error"][-3000:]
    assert launched, f"nothing reached the stand-in driver's launch:\n{stderr[-3000:]}"
    assert not any(word in stderr for word in REFUSED), stderr[-3000:]
