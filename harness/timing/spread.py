"""When a timing can be trusted: the rule for a spread too wide for its median, and for a speedup
too large to take at its word. The worker reads it to decide whether to measure again; the judging
process reads it again on the reps its own witness saw, and decides.

Spread: the interquartile range over the median of one round of reps. A round wider than
SPREAD_LIMIT is measured again, once; when the second round is as wide, the verdict says so in
words (timing.spread_ok False, timing.spread_note) and the search never keeps the candidate on that
median (autokernel/search/decision.py). The limit was chosen from honest kernels judged on a loaded
machine (benchmarks/judge_witness.py `honest --load 1 --kernel ...`: a small good softmax and the
softmax, rmsnorm and reduce starters, two cores, the other one busy and the machine shared): their
rounds' IQR was 1% to 39% of the median, one first round 94% that its second round (20%) redeemed;
a kernel whose work varies wildly from call to call (tests/attacks: every other call twelve times
the work) measured 947% then 94%. On the CPU (the Triton interpreter on a shared machine) the limit
is 75%, so that two wide rounds in a row stay out of an honest kernel's reach; on a GPU, where
honest reps spread by a few per cent, 50%.

A busy machine: the judging process reads, over each round, the share of the time some task on the
machine waited for a CPU (harness/timing/witness.py). Where a round too wide to trust was timed
while that share was at least BUSY_SHARE, the note says the machine was oversubscribed, so that a
run whose candidates go unkept on a loaded machine says why and what to do. The verdict is the
same: a median that means nothing is not kept, whatever made it so. Two cores and three or more
busy processes keep the share near 100%; one judge beside one busy process, a few per cent.

Excessive speedup: KernelBench's flag, a candidate more than EXCESSIVE_SPEEDUP times faster than
PyTorch eager. It is re-timed (a second round), and the second round's median is held to the
physical floor (harness/device/roofline.py) with a margin of 0.9, not the usual half: a real kernel does
not move its bytes much faster than the device's measured copy bandwidth (a kernel that mostly
reads may beat a copy by a few per cent, hence not 1.0).
"""
from __future__ import annotations

SPREAD_LIMIT = {"cpu": 0.75, "cuda": 0.5}
EXCESSIVE_SPEEDUP = 10.0
SECOND_LOOK_FLOOR_MARGIN = 0.9
BUSY_SHARE = 0.5


def ratio(median_us: float, iqr_us: float) -> float:
    return iqr_us / median_us if median_us > 0 else float("inf")


def too_wide(median_us: float, iqr_us: float, device: str) -> bool:
    return ratio(median_us, iqr_us) > SPREAD_LIMIT.get(device, 0.5)


def second_look(median_us: float, iqr_us: float, eager_median_us: float | None, device: str) -> str | None:
    """Why a first round must be measured again, or None."""
    if too_wide(median_us, iqr_us, device):
        return (f"the reps' spread (IQR {iqr_us:.4g} us) is {100 * ratio(median_us, iqr_us):.0f}% of the median "
                f"{median_us:.4g} us, above the {100 * SPREAD_LIMIT.get(device, 0.5):.0f}% a median can stand")
    if eager_median_us and median_us > 0 and eager_median_us / median_us > EXCESSIVE_SPEEDUP:
        return (f"{eager_median_us / median_us:.3g}x faster than PyTorch eager, above the {EXCESSIVE_SPEEDUP:g}x "
                "that earns a second look")
    return None
