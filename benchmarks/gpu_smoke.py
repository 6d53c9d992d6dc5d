"""The GPU check's smoke (benchmarks/gpu_check.sh, STEPS=smoke): what a first real launch needs,
checked in a couple of minutes, so that a fix can be tried again before the full check.

    python benchmarks/gpu_smoke.py machine
        what the CPU rehearsal of a first launch assumes (tests/support/standin_gpu.py), and this
        machine's own answer beside each: versions, where gcc and libcuda.so.1 live, the driver
    python benchmarks/gpu_smoke.py serve [--device cuda] [--dtype float16]
        a finished run on the tiny LLaMA whose winners are two Triton starters (rmsnorm, matmul),
        exported; the package's patch() serving the unmodified model in a plain process (its own
        audit hook on); then `autokernel verify` of the run, in its sandbox. Exit 1 unless every
        winner served and the outputs match.

With --device cpu (DRY_RUN=1 in gpu_check.sh) the same runs through the Triton interpreter.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = ROOT / "tests" / "support"
sys.path[:0] = [str(ROOT), str(SUPPORT)]


def machine() -> int:
    import standin_gpu
    answers = _answers()
    print("what the CPU rehearsal assumes  ->  this machine")
    for key, assumed in standin_gpu.ASSUMPTIONS.items():
        print(f"- {key}: {assumed}\n    here: {answers.get(key, 'not asked')}")
    return 0


def _answers() -> dict[str, str]:
    import torch
    import triton
    out: dict[str, str] = {}
    try:
        from importlib.metadata import version
        filelock = version("filelock")
    except Exception as e:  # noqa: BLE001 - a missing package is an answer too
        filelock = f"not installed ({type(e).__name__})"
    out["torch"] = f"torch {torch.__version__} (CUDA {torch.version.cuda}), cuda available: {torch.cuda.is_available()}"
    out["triton"] = f"triton {triton.__version__}"
    out["filelock"] = f"filelock {filelock}"
    gcc = shutil.which("gcc")
    real = os.path.realpath(gcc) if gcc else None
    out["gcc"] = (f"{gcc} -> {real} ({'inside' if real.startswith('/usr/') else 'OUTSIDE'} /usr); CC={os.environ.get('CC')}"
                  if gcc else "no gcc on PATH")
    out["libcuda.so.1"] = _libcuda()
    out["driver"] = _driver()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        optin = getattr(p, "shared_memory_per_block_optin", "?")
        out["device"] = (f"{p.name}, compute capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                         f"{optin} B of opt-in shared memory per block")
    else:
        out["device"] = "no CUDA device"
    return out


def _libcuda() -> str:
    try:
        listing = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        found = [line.strip() for line in listing.splitlines() if "libcuda.so.1" in line]
    except (OSError, subprocess.TimeoutExpired) as e:
        found = [f"ldconfig -p failed: {e}"]
    ld = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and Path(p, "libcuda.so.1").exists()]
    return (f"ldconfig -p: {found or 'none'}; LD_LIBRARY_PATH folders holding it: {ld or 'none'}; "
            f"TRITON_LIBCUDA_PATH={os.environ.get('TRITON_LIBCUDA_PATH')}")


def _driver() -> str:
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        lib.cuDriverGetVersion(ctypes.byref(version))
        api = f"cuDriverGetVersion {version.value}"
    except OSError as e:
        api = f"libcuda.so.1 not loadable: {e}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip() or "no answer"
    except (OSError, subprocess.TimeoutExpired):
        smi = "nvidia-smi not available"
    return f"{api}; nvidia-smi driver {smi}"


# the tiny LLaMA's targets the smoke serves: a module route and an op route
SERVED = ("rmsnorm", "matmul")
PATCH = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import autokernel_kernels as ak
import importlib.util
spec = importlib.util.spec_from_file_location("user_model", sys.argv[2])
example = importlib.util.module_from_spec(spec); spec.loader.exec_module(example)
device, dtype = sys.argv[3], getattr(torch, sys.argv[4])
torch.manual_seed(0)
model = example.LlamaTiny(64, 32, 1, 2, 64).eval().to(device=device, dtype=dtype)
tokens = torch.randint(0, 64, (1, 8), device=device)
with torch.inference_mode():
    expected = model(tokens)
    with ak.patch(model) as router:
        out = model(tokens)
err = (out.float() - expected.float()).abs().max().item()
print(json.dumps({"max_abs_err": err, "guard": ak._guarded, "per_kernel": router.tally.to_json()["per_kernel"]}))
'''


def serve(device: str, dtype: str) -> int:
    from autokernel.deploy.export import export
    from tiny_llama import LLAMA, TARGETS, make_run
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        targets = [(t.replace("float32", dtype), *rest) for t, *rest in TARGETS if rest[0] in SERVED]
        run = make_run(Path(tmp), targets, dtype=dtype, model_dtype=dtype, device=device)
        export(run, Path(tmp, "package"))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a user's process: no project code
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        proc = subprocess.run([sys.executable, "-c", PATCH, str(Path(tmp, "package")), str(LLAMA), device, dtype],
                              env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            print(f"patch(): FAILED\n{proc.stderr[-3000:]}")
            return 1
        patched = json.loads(proc.stdout.strip().splitlines()[-1])
        served = {t: k.get("calls_served", 0) for t, k in patched["per_kernel"].items()}
        print(f"patch() in a plain process: guard {patched['guard']}, calls served {served}, "
              f"max abs error vs the unpatched model {patched['max_abs_err']:.3g}")
        ok &= all(n > 0 for n in served.values()) and len(served) == len(SERVED) and patched["max_abs_err"] < 5e-2
        verify = subprocess.run([sys.executable, "-m", "autokernel", "verify", str(run), "--device", device],
                                cwd=ROOT, capture_output=True, text=True, timeout=600)
        print(verify.stdout[-2000:] or verify.stderr[-2000:])
        result = json.loads(Path(run, "verify.json").read_text()) if Path(run, "verify.json").is_file() else {}
        verdict = {k: result.get(k) for k in ("ok", "outputs_match", "max_abs_err", "device", "guilty")}
        print(f"verify: exit {verify.returncode}, {json.dumps(verdict)}, served "
              f"{ {t: k.get('calls_served') for t, k in result.get('per_kernel', {}).items()} }")
        ok &= verify.returncode == 0 and bool(result.get("ok"))
    print("smoke: " + ("every winner served, outputs match" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_smoke.py")
    p.add_argument("what", choices=("machine", "serve"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="default: float16 on a GPU, float32 on the CPU")
    ns = p.parse_args(argv)
    if ns.what == "machine":
        return machine()
    if ns.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return serve(ns.device, ns.dtype or ("float32" if ns.device == "cpu" else "float16"))


if __name__ == "__main__":
    raise SystemExit(main())
