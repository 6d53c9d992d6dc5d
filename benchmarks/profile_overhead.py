"""What the profiler costs: a profiled forward against a plain one, and the whole command.

    python benchmarks/profile_overhead.py [--model examples/llama_tiny.py] [--rounds 4]

Prints the cost of one forward plain, under torch.profiler alone (record_shapes), and under
torch.profiler plus the module hooks `autokernel profile` uses (target: at most 1.5x plain), as the
CPU time of the thread that runs it (one torch thread: a busy machine cannot inflate it) and as
wall time; then the wall time of the whole `autokernel profile` command on the model, with the
device peaks probed fresh and with them cached (target: under 30 s). Plain and profiled forwards
alternate in rounds, so a machine that gets busier or quieter meanwhile shifts both alike.
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

from torch.autograd.profiler import record_function  # noqa: E402

from autokernel.profile import profiler  # noqa: E402
from autokernel.profile.modelfile import load_model, spec_from_options  # noqa: E402
from autokernel.profile.profiler import profile_model  # noqa: E402


class Clocks:
    """Wall time and this thread's CPU time of each forward. With one torch thread every op runs on
    this thread, so its CPU time is what another process on a busy machine cannot inflate."""

    def __init__(self):
        self.wall_ms, self.cpu_ms = [], []

    def run(self, forward, inputs, label=None):
        w, c = time.perf_counter(), time.thread_time()
        if label:
            with record_function(label):
                forward(inputs)
        else:
            forward(inputs)
        self.cpu_ms.append((time.thread_time() - c) * 1e3)
        self.wall_ms.append((time.perf_counter() - w) * 1e3)


def profiled(loaded, inputs, iters: int, clocks: Clocks, hooks: bool) -> None:
    """The forwards as profile_model runs them: record_shapes, and the module hooks if asked."""
    handles = profiler._hook_modules(dict(loaded.model.named_modules())) if hooks else []
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
            for _ in range(iters):
                clocks.run(loaded.forward, inputs, profiler.ROOT)
    finally:
        for h in handles:
            h.remove()


def command_s(model: str, cache_dir: str) -> float:
    env = {**os.environ, "AUTOKERNEL_CACHE_DIR": cache_dir}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autokernel", "profile", model, "--json", os.devnull],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def line(label: str, samples: list[float], plain: list[float] | None = None) -> str:
    text = f"  {label:32s} min {min(samples):8.2f} ms   median {statistics.median(samples):8.2f} ms"
    if plain:
        text += (f"   x{min(samples) / min(plain):.2f} (min)   "
                 f"x{statistics.median(samples) / statistics.median(plain):.2f} (median)")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="examples/llama_tiny.py")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=5, help="forwards of each kind per round")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the forward comparison")
    args = ap.parse_args()
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    loaded = load_model(spec_from_options(ROOT / args.model, device="cpu"))
    inputs = loaded.make_inputs(0)
    for _ in range(3):
        loaded.forward(inputs)
    plain, bare, hooked = Clocks(), Clocks(), Clocks()
    for _ in range(args.rounds):
        for _ in range(args.iters):
            plain.run(loaded.forward, inputs)
        profiled(loaded, inputs, args.iters, bare, hooks=False)
        profiled(loaded, inputs, args.iters, hooked, hooks=True)
    print(f"model {args.model} on cpu, {args.threads} torch thread(s), load average {os.getloadavg()[0]:.2f}; "
          "CPU figures")
    for clock in ("cpu_ms", "wall_ms"):
        print("CPU time of the forward's thread:" if clock == "cpu_ms" else "wall time:")
        base = getattr(plain, clock)
        print(line("plain forward", base))
        print(line("torch.profiler, record_shapes", getattr(bare, clock), base))
        print(line("torch.profiler + module hooks", getattr(hooked, clock), base))
    torch.set_num_threads(default_threads)  # the command below runs as a user would run it
    t0 = time.perf_counter()
    prof = profile_model(loaded, iters=10, warmup=3)
    spent = time.perf_counter() - t0 - sum(prof.profiled_samples_ms + prof.forward_samples_ms) / 1e3
    print(f"profile_model(iters=10): {spent:.2f} s besides the forwards (profiler start, events, attribution); "
          f"coverage {prof.coverage:.1%}")
    with tempfile.TemporaryDirectory() as cache:
        fresh = command_s(args.model, cache)
        cached = command_s(args.model, cache)
    print(f"`autokernel profile {args.model}`: {fresh:.1f} s with the peaks probed, {cached:.1f} s with them cached")


if __name__ == "__main__":
    main()
