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


def rehearse(place: str, args: list, env: dict, cwd: Path) -> tuple[dict, list[str], str]:
    """Run one place in a fresh process (tests/support/first_launch.py): its result, the kernels the
    stand-in launched, its stderr."""
    proc = subprocess.run([sys.executable, "-m", "first_launch", place, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
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


def assert_launched(result: dict, launched: list[str], stderr: str) -> None:
    assert result["sandbox"] == "landlock", result
    for call in result["calls"]:
        assert call["error"] is None, call["error"][-3000:]
    assert launched, f"nothing reached the stand-in driver's launch:\n{stderr[-3000:]}"
    assert not any(word in stderr for word in REFUSED), stderr[-3000:]
