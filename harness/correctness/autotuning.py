"""@triton.autotune over several configs in the Triton interpreter: refused, saying why.

On a GPU, an autotuned kernel's first launch with a key it has not seen benchmarks every config that
survives pruning (each config's kernel called many times on the launch's own arguments:
triton.testing.do_bench's calls to estimate, then about 25 ms of warm-up and 100 ms of timed calls,
a count that depends on the kernel's speed), and the fastest config runs the launch. The interpreter
has no benchmarker: Triton's autotuner asks the GPU driver for one, and the kernel failed at its
first call with "0 active drivers", a message that said nothing of the kernel.

Nor can the judge stand in for it. Which config a GPU finds fastest is not known on the CPU, and
every config a GPU might pick would have to be right at every key; and what the benchmarking calls
leave in the launch's arguments depends on how many there were. A red team showed both: with the
benchmark emulated (each config called twice, the k-th key picking the k-th config), a kernel with a
config that reads nothing, never picked here and the fastest on a GPU, passed; so did one whose
result is right only after an odd number of launches, and one that counts its launches.

So on the interpreter a launch of an autotune over more than one config fails with what to do
instead: give the kernel its one config from CONFIG, which the tuner searches (TUNABLES). Counted
as declared, not as pruning leaves them: Triton 3.9 skips the benchmark for a sole survivor where
3.6, a GPU image's, benchmarks it, and a pruning function may leave one config on the CPU and two on
a GPU. The refusal stands once made: a kernel_fn that catches it and falls back to another kernel
has its call fail all the same (`LaunchMonitor.refused`, read by every checked call and at every
stage's end), or the fallback would be judged while a GPU runs the autotuned kernel. An autotune
over one config runs it, as Triton does. On a GPU Triton's autotuner runs as shipped.

`install(monitor)` replaces the autotuner's launch once per process, from the launch monitor's
install where the interpreter runs (harness/correctness/launches.py): the judge, verify's child and
an exported package on the CPU alike.
"""
from __future__ import annotations


class AutotuneNotJudged(RuntimeError):
    """A multi-config @triton.autotune launch under the interpreter."""


def refusal(name: str, configs: int) -> str:
    return (f"@triton.autotune over {configs} configs ({name}): on the CPU the judge cannot know which config a "
            "GPU's benchmark would pick, nor what its benchmarking calls would leave in the launch's arguments, "
            "so it cannot judge the kernel a GPU would run. Give the kernel one config (CONFIG's values, read in "
            "kernel_fn): the tuner searches TUNABLES across experiments, each one judged.")


def install(monitor) -> None:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    original = Autotuner.run
    if getattr(original, "refuses", False):
        return

    def run(self, *args, **kwargs):
        if len(self.configs) > 1:
            monitor.refused = monitor.refused or refusal(getattr(self.base_fn, "__name__", "a kernel"),
                                                         len(self.configs))
            raise AutotuneNotJudged(monitor.refused)
        return original(self, *args, **kwargs)

    run.refuses, run.__wrapped__ = True, original
    Autotuner.run = run
