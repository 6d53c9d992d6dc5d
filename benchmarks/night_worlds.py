"""The worlds of the simulated night (benchmarks/night.py): seeded models whose targets each hide
what the search must find out, in three families.

"plan": the first family, as the night was first measured. Every plan ceiling is 1-1.6x above
the hidden one (the roofline is optimistic but never wrong the other way), failure rates 20-70%,
every verdict about 10 s, shares drawn from an exponential.

"wrong": the second family, where what the plan says is often wrong, the way real plans are. It
was written down, with these ranges, before the scheduler was tuned against it, and is not
changed to suit it. Each target is one of these kinds:

- near peak (a matmul cuBLAS already runs near the hardware's limit): the starter is within 10% of
  the hidden ceiling of 1.0-1.15x, and the plan promises 2-4x;
- over-promised: a hidden ceiling of 1.2-2x, the plan 2-4x higher still;
- tight (a memory-bound norm that can reach 90% of bandwidth): a hidden ceiling of 1.5-4x, the
  plan within 10% of it;
- under-promised (a peak probe that read low): a hidden ceiling of 1.5-4x, the plan 60-90% of it;
- unknown (a module target: the plan knows no ceiling): a hidden ceiling of 1.3-5x.

A fifth of the targets are near-dead (90-97% of candidates fail), the rest fail 20-70%. Verdicts
take 10-100 s (log-uniform: a small softmax against a large attention's shape sweep), and shares
are drawn from a lognormal with sigma 1.5, so one target often holds half of the model.

"many": the third family, many small targets, where a short budget covers only part of them. It
was written down, with these ranges, before the scheduler was tuned against it (in the commit that
added it), and is not changed to suit it:

- 20-40 targets (uniform), covering 75-95% of the model's time;
- shares from a lognormal with sigma 1.0, then capped: no target holds more than 15% of the model
  (what a cap cuts is spread over the others in proportion, until none is above it);
- each target is of the second family's kinds (near peak, over-promised, tight, under-promised,
  unknown), with the same ranges; a fifth near-dead (90-97% of candidates fail), the rest 20-70%;
- verdicts of 10-100 s (log-uniform), starters of 0.5-1.1x (within 10% of the ceiling near peak).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from autokernel.search.run import TargetState

VERDICT_S = 10.0  # a passing verdict's simulated seconds, unless the world says otherwise
FAMILIES = ("plan", "wrong", "many")
MANY_CAP = 0.15  # the largest share of the model one target of the "many" family holds
KINDS = ("near_peak", "over", "tight", "under", "unknown")


@dataclass
class Hidden:
    """What the world knows of a target and the search does not."""

    ceiling: float  # the best speedup over eager any kernel can reach
    failure: float  # the chance a candidate fails a stage
    starter: float  # the starter's speedup over eager
    verdict_s: float = VERDICT_S  # a passing verdict's seconds (a failing one takes 40% of it)


def make_world(family: str, seed: int, count: int = 8) -> tuple[list[TargetState], dict[str, Hidden]]:
    """The world's targets in the plan's order, and what each hides (`count`: the targets of the
    first two families; the third draws its own)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family of worlds {family!r}: one of {', '.join(FAMILIES)}")
    make = {"plan": plan_world, "wrong": wrong_world, "many": many_world}[family]
    targets, hidden = make(seed, count)
    # the plan's order: what each target could win at its (roofline) ceiling, most first
    targets.sort(key=lambda t: -t.share * (1 - 1 / (t.ceiling_speedup or 2.0)))
    for rank, t in enumerate(targets, 1):
        t.rank = rank
    return targets, hidden


def _target(name: str, share: float, ceiling: float | None) -> TargetState:
    return TargetState(name=name, kernel_type="softmax", dims={"M": 1, "N": 1}, dtype="float32", share=share,
                       ceiling_speedup=ceiling)


def plan_world(seed: int, count: int) -> tuple[list[TargetState], dict[str, Hidden]]:
    rng = random.Random(seed)
    weights = [rng.expovariate(1.0) for _ in range(count)]
    coverage = rng.uniform(0.75, 0.95)  # the rest of the model's time is in ops nobody searches
    targets, hidden = [], {}
    for i, w in enumerate(weights):
        name = f"t{i}[{seed}]"
        ceiling = rng.uniform(1.3, 5.0)
        hidden[name] = Hidden(ceiling=ceiling, failure=rng.uniform(0.2, 0.7), starter=rng.uniform(0.5, 1.1))
        targets.append(_target(name, coverage * w / sum(weights), ceiling * rng.uniform(1.0, 1.6)))
    return targets, hidden


def wrong_world(seed: int, count: int) -> tuple[list[TargetState], dict[str, Hidden]]:
    rng = random.Random(10_000 + seed)  # apart from the first family's seeds
    weights = [rng.lognormvariate(0.0, 1.5) for _ in range(count)]
    coverage = rng.uniform(0.75, 0.95)
    return _wrong_targets(rng, "w", seed, [coverage * w / sum(weights) for w in weights])


def many_world(seed: int, count: int) -> tuple[list[TargetState], dict[str, Hidden]]:
    """The third family: 20-40 small targets, none above MANY_CAP of the model (`count` unused)."""
    rng = random.Random(20_000 + seed)  # apart from the other families' seeds
    weights = [rng.lognormvariate(0.0, 1.0) for _ in range(rng.randint(20, 40))]
    coverage = rng.uniform(0.75, 0.95)
    return _wrong_targets(rng, "m", seed, capped([coverage * w / sum(weights) for w in weights], MANY_CAP))


def capped(shares: list[float], cap: float) -> list[float]:
    """The shares with none above `cap`: what is cut is spread over the others in proportion."""
    shares = list(shares)
    while max(shares) > cap * (1 + 1e-9):
        over = sum(s - cap for s in shares if s > cap)
        under = sum(s for s in shares if s < cap)
        shares = [cap if s >= cap else s + over * s / under for s in shares]
    return shares


def _wrong_targets(rng: random.Random, prefix: str, seed: int,
                   shares: list[float]) -> tuple[list[TargetState], dict[str, Hidden]]:
    """Targets of the second family's kinds, failure rates and verdict times, with these shares."""
    targets, hidden = [], {}
    for i, share in enumerate(shares):
        name = f"{prefix}{i}[{seed}]"
        kind = rng.choice(KINDS)
        ceiling, plan = _ceilings(kind, rng)
        starter = ceiling * rng.uniform(0.9, 1.0) if kind == "near_peak" else min(rng.uniform(0.5, 1.1), ceiling)
        failure = rng.uniform(0.9, 0.97) if rng.random() < 0.2 else rng.uniform(0.2, 0.7)
        verdict_s = VERDICT_S * 10 ** rng.uniform(0.0, 1.0)
        hidden[name] = Hidden(ceiling=ceiling, failure=failure, starter=starter, verdict_s=verdict_s)
        targets.append(_target(name, share, plan))
    return targets, hidden


def _ceilings(kind: str, rng: random.Random) -> tuple[float, float | None]:
    """(hidden ceiling, the plan's ceiling or None) for a target of this kind."""
    if kind == "near_peak":
        ceiling = rng.uniform(1.0, 1.15)
        return ceiling, rng.uniform(2.0, 4.0)
    if kind == "over":
        ceiling = rng.uniform(1.2, 2.0)
        return ceiling, ceiling * rng.uniform(2.0, 4.0)
    if kind == "tight":
        ceiling = rng.uniform(1.5, 4.0)
        return ceiling, ceiling * rng.uniform(1.0, 1.1)
    if kind == "under":
        ceiling = rng.uniform(1.5, 4.0)
        return ceiling, max(ceiling * rng.uniform(0.6, 0.9), 1.05)
    return rng.uniform(1.3, 5.0), None


def oracle_e2e(targets: list[TargetState], hidden: dict[str, Hidden]) -> float:
    """The end-to-end speedup if every target reached its hidden ceiling: what no policy can beat."""
    saved = sum(t.share * (1 - 1 / max(hidden[t.name].ceiling, 1.0)) for t in targets)
    return 1 / (1 - saved)
