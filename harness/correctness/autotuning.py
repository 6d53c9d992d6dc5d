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

So on the interpreter a launch that would benchmark (more than one config left after pruning)
fails with what to do instead: give the kernel its one config from CONFIG, which the tuner searches
(TUNABLES). An autotune over one config runs it as Triton does, with no benchmark; so does one pruned
to a single config where Triton skips the benchmark for it (3.9 does; 3.6 benchmarks even that one,
and there it is refused too). On a GPU Triton's autotuner runs as shipped.

`install()` replaces the autotuner's benchmark once per process, from the launch monitor's
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


def install() -> None:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    original = Autotuner._bench
    if getattr(original, "refuses", False):
        return

    def _bench(self, *args, config, **meta):
        raise AutotuneNotJudged(refusal(getattr(self.base_fn, "__name__", "a kernel"), len(self.configs)))

    _bench.refuses, _bench.__wrapped__ = True, original
    Autotuner._bench = _bench
