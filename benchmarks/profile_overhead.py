"""What the profiler costs: a profiled forward against a plain one, and the whole command.

    python benchmarks/profile_overhead.py [--model examples/llama_tiny.py] [--rounds 4]

Prints the wall time of one forward plain, under torch.profiler alone (record_shapes), and under
torch.profiler plus the module hooks `autokernel profile` uses (target: at most 1.5x plain), then
the wall time of the whole `autokernel profile` command on the model, with the device peaks probed
fresh and with them cached (target: under 30 s). Plain and profiled forwards alternate in rounds,
so a machine that gets busier or quieter meanwhile shifts both alike. On a CPU these are CPU figures.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from autokernel.modelfile import load_model, spec_from_options  # noqa: E402
from autokernel.profiler import profile_model  # noqa: E402


def profiler_only_ms(loaded, inputs, iters: int) -> list[float]:
    samples = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
        for _ in range(iters):
            t0 = time.perf_counter()
            loaded.forward(inputs)
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def command_s(model: str, cache_dir: str) -> float:
    env = {**os.environ, "AUTOKERNEL_CACHE_DIR": cache_dir}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autokernel", "profile", model, "--json", os.devnull],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def line(label: str, samples: list[float], plain: list[float] | None = None) -> str:
    text = f"{label:34s} min {min(samples):8.2f} ms   median {statistics.median(samples):8.2f} ms"
    if plain:
        text += (f"   x{min(samples) / min(plain):.2f} (min)   "
                 f"x{statistics.median(samples) / statistics.median(plain):.2f} (median)")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="examples/llama_tiny.py")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iters", type=int, default=5, help="forwards of each kind per round")
    args = ap.parse_args()
    loaded = load_model(spec_from_options(ROOT / args.model, device="cpu"))
    inputs = loaded.make_inputs(0)
    plain, bare, hooked, analysis_s = [], [], [], []
    for _ in range(args.rounds):
        for _ in range(args.iters):
            t0 = time.perf_counter()
            loaded.forward(inputs)
            plain.append((time.perf_counter() - t0) * 1e3)
        bare += profiler_only_ms(loaded, inputs, args.iters)
        t0 = time.perf_counter()
        prof = profile_model(loaded, iters=args.iters, warmup=1)
        analysis_s.append(time.perf_counter() - t0 - sum(prof.profiled_samples_ms + prof.forward_samples_ms) / 1e3)
        hooked += prof.profiled_samples_ms
    print(f"model {args.model} on cpu ({torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.2f}); CPU figures")
    print(line("plain forward", plain))
    print(line("torch.profiler, record_shapes", bare, plain))
    print(line("torch.profiler + module hooks", hooked, plain))
    print(f"{'attribution after the forwards':34s} median {statistics.median(analysis_s):8.2f} s "
          f"for {args.iters} profiled forwards")
    print(f"coverage {prof.coverage:.1%}, {len(prof.groups)} groups")
    with tempfile.TemporaryDirectory() as cache:
        fresh = command_s(args.model, cache)
        cached = command_s(args.model, cache)
    print(f"`autokernel profile {args.model}`: {fresh:.1f} s with the peaks probed, {cached:.1f} s with them cached")


if __name__ == "__main__":
    main()
