"""The optimisation playbook given to the LLM: six tiers of advice plus the rules of the judge, and
for training targets the backward's contract and advice (training.md).

The markdown files ship as package data and are read through importlib.resources, so they are found
from a wheel or a non-editable install as well as from a checkout. `choose` picks the advice that
fits where a search stands: which tier to read next, and the tricks for the kernel type at hand.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

TIERS = {
    1: "tier1_launch_tiling",
    2: "tier2_memory",
    3: "tier3_compute_precision",
    4: "tier4_algorithmic",
    5: "tier5_architecture",
    6: "tier6_kernel_specific",
}
RULES = "rules"
TRAINING = "training"  # the backward's contract and advice, for training targets only

# Stages whose failure means the kernel computes the wrong thing: the next prompt should not push
# for a bolder rewrite, it should get the current idea right first.
CORRECTNESS_STAGES = ("compile", "smoke", "shape_sweep", "stability", "determinism", "edge_cases",
                      "integrity", "parse")

# How many experiments a search spends on a tier before the advice moves on to the next one.
EXPERIMENTS_PER_TIER = 3


def names() -> list[str]:
    return [RULES, TRAINING, *TIERS.values()]


def read(name: str) -> str:
    """The markdown text of one playbook file, by name with or without `.md`."""
    stem = name[:-3] if name.endswith(".md") else name
    if stem not in names():
        raise KeyError(f"no playbook file {name!r}: known files are {', '.join(names())}")
    return resources.files(__package__).joinpath(f"{stem}.md").read_text(encoding="utf-8")


def kernel_tricks(kernel_type: str) -> str:
    """The `## <kernel_type>` section of tier 6, or "" when the type has none."""
    text = read(TIERS[6])
    match = re.search(rf"^## {re.escape(kernel_type)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return f"## Tricks for {kernel_type}\n{match.group(1).strip()}\n" if match else ""


@dataclass(frozen=True)
class Section:
    """The advice for one experiment: a tier's file and the kernel type's own tricks."""

    tier: int
    name: str
    text: str


def tier_for(bound: str | None, experiments: int, failed_stage: str | None = None) -> int:
    """Which tier of advice fits: cheap launch tuning first, then the tier that matches the roofline
    position (memory: access patterns; compute: tensor cores), then restructuring, then the
    architecture's features, cycling once all have been offered."""
    if bound == "compute":
        order = [1, 3, 4, 5, 2]
    else:  # memory-bound, or unknown: most kernels of a model are memory-bound
        order = [1, 2, 4, 3, 5]
    step = max(experiments - 1, 0) // EXPERIMENTS_PER_TIER
    if failed_stage in CORRECTNESS_STAGES and step > 0:
        # a broken candidate is not a reason to escalate: stay one tier back until it is fixed
        step -= 1
    return order[step % len(order)]


def choose(kernel_type: str, *, bound: str | None = None, failed_stage: str | None = None,
           experiments: int = 0) -> Section:
    """The playbook section for the next experiment on a kernel of `kernel_type`.

    `bound` is the roofline position of the best kernel so far ("memory" or "compute"),
    `failed_stage` the stage the last candidate failed (or "parse" when the reply held no kernel),
    `experiments` how many proposals the search has made on this target.
    """
    tier = tier_for(bound, experiments, failed_stage)
    text = read(TIERS[tier]).strip() + "\n"
    tricks = kernel_tricks(kernel_type)
    if tricks:
        text += "\n" + tricks
    return Section(tier=tier, name=TIERS[tier], text=text)
