"""A machine without a GPU made to look like one to Triton's NVIDIA backend, for rehearsing a first
real launch (tests/rehearsal/): a stand-in CUDA driver built here with gcc from
tests/rehearsal/standin_libcuda.c, found the way the real one is (LD_LIBRARY_PATH), and the few
device and stream queries of a CPU build of torch filled in Python. Nothing else is faked: Triton
runs its real driver code, builds its launcher support with gcc, compiles with its own ptxas and
loads the cubin through the stand-in, whose launches do nothing.

What the rehearsal assumes of a GPU machine is ASSUMPTIONS; benchmarks/gpu_check.sh prints the
real machine's answers beside them first, so that a difference finds its way back here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from paths import ROOT

SOURCE = ROOT / "tests" / "rehearsal" / "standin_libcuda.c"
TRACE = "AUTOKERNEL_STANDIN_TRACE"  # set: the stand-in tells each launch on stderr
LAUNCH_LINE = "standin-libcuda: launch "

# What the stand-in and the fills below answer, and what the rehearsal's environment is: each a
# fact a GPU machine may contradict (benchmarks/gpu_check.sh prints the machine's own beside it).
ASSUMPTIONS = {
    "device": "one GPU, compute capability 9.0 (sm_90), 132 SMs, 227 KiB of opt-in shared memory per block",
    "driver": "CUDA driver API 12.8 (cuDriverGetVersion 12080, a 570-series driver): it refuses the "
              "oversized-shared-memory attribute, so Triton takes the MAX_DYNAMIC_SHARED_SIZE_BYTES path",
    "libcuda.so.1": "found through LD_LIBRARY_PATH (Triton asks `ldconfig -p` first, then LD_LIBRARY_PATH)",
    "gcc": "gcc on PATH; also rehearsed with gcc outside /usr (an H200 image keeps it in /opt/gcc)",
    "torch": "a CPU build: is_available, init, current_device, set_device, device_count, "
             "get_device_capability, synchronize and the current raw stream answered in Python",
    "triton": "the installed Triton (3.9 here), and 3.6 (a GPU image's) where a copy is named by "
              "AUTOKERNEL_TRITON36 (its folder, from the wheel)",
    "filelock": "the installed filelock (4.x reads frames inside its lock)",
}


def missing() -> str | None:
    """Why a first launch cannot be rehearsed on this machine, or None."""
    from harness.isolation.sandbox import abi_version
    if shutil.which("gcc") is None:
        return "gcc is not installed: the stand-in driver and Triton's launcher support are built with it"
    if abi_version() < 1:
        return "Landlock is not available in this kernel or container: the rehearsal runs inside the real sandbox"
    return None


def build(folder: Path) -> Path:
    """The stand-in driver, built with gcc into `folder`/libcuda.so.1; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(folder / "libcuda.so.1"),
                    str(SOURCE)], check=True, capture_output=True, text=True)
    return folder


def environment(base: dict, driver: Path, triton: Path | None = None, path_first: Path | None = None) -> dict:
    """`base` with the driver found through LD_LIBRARY_PATH, Triton compiling for real (not its
    interpreter), launches told on stderr; `triton`: another Triton's folder, first on PYTHONPATH;
    `path_first`: a folder first on PATH (a compiler installed elsewhere)."""
    env = {k: v for k, v in base.items() if k != "TRITON_INTERPRET"}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(driver), env.get("LD_LIBRARY_PATH", "")) if p)
    env[TRACE] = "1"
    support = str(ROOT / "tests" / "support")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(triton) if triton else "", str(ROOT), support,
                                                     env.get("PYTHONPATH", "")) if p)
    if path_first is not None:
        env["PATH"] = os.pathsep.join((str(path_first), env.get("PATH", "")))
    return env


def fill_torch_queries() -> None:
    """Answer the device and stream queries a CPU build of torch cannot, as one GPU would: what
    Triton's driver asks torch (is a GPU there, which one, its capability, the current stream) and
    what the project's processes ask before a launch (init, synchronize). Tensors stay on the CPU:
    the stand-in driver takes their addresses and runs nothing."""
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.init = lambda: None
    torch.cuda.current_device = lambda: 0
    torch.cuda.set_device = lambda device: None
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.synchronize = lambda device=None: None
    torch._C._cuda_getCurrentRawStream = lambda device: 0


def launches_told(stderr: str) -> list[str]:
    """The kernels the stand-in launched, by name, in order, from a child's stderr."""
    return [line[len(LAUNCH_LINE):].split()[0] for line in stderr.splitlines() if line.startswith(LAUNCH_LINE)]


def gcc_elsewhere(folder: Path) -> Path:
    """gcc installed outside /usr (`folder`/gcc), as an H200 image has it in /opt/gcc: its driver
    copied to bin/gcc, and its lib/gcc (cc1 and the runtime) linked to the system's, where the driver
    looks beside itself. Returns the bin folder, to put first on PATH."""
    real = Path(os.path.realpath(shutil.which("gcc")))
    prefix = folder / "gcc"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(real, prefix / "bin" / "gcc")
    system = real.parent.parent  # /usr
    for sub in ("lib/gcc", "libexec/gcc"):
        if (system / sub).is_dir():
            (prefix / sub).parent.mkdir(parents=True, exist_ok=True)
            (prefix / sub).symlink_to(system / sub)
    return prefix / "bin"
