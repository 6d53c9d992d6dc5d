"""A target's population: the best few passing kernels that differ from each other (the elites),
a parent for each proposal and one or two inspirations beside it.

The elites live in the target's state (state.json), so a resume keeps them. Each is a small dict:
number, median_us, iqr_us, reps, sha256 (of the candidate's text), description. Pure functions.
"""
from __future__ import annotations

import random
from typing import Any

ELITES = 4
PARENT_IS_BEST = 0.7  # the chance a proposal's parent is the best; otherwise another elite
INSPIRATIONS = 2


def admit(elites: list[dict], entry: dict, limit: int = ELITES) -> list[dict]:
    """The elites with `entry` (a passing kernel) considered: distinct texts only, fastest first,
    at most `limit`."""
    if any(e["sha256"] == entry["sha256"] for e in elites):
        return list(elites)
    merged = sorted([*elites, entry], key=lambda e: e["median_us"])
    return merged[:limit]


def choose_parent(elites: list[dict], best_number: int | None, seed: str, explore: bool = True) -> dict | None:
    """The parent of the next proposal: usually the best, sometimes another elite (seeded by the
    experiment, so a resume chooses as the first session would have); the best alone where
    `explore` is False (the time left is too short for another elite's line to pay back)."""
    if not elites:
        return None
    best = next((e for e in elites if e["number"] == best_number), elites[0])
    others = [e for e in elites if e is not best]
    rng = random.Random(seed)
    if others and explore and rng.random() >= PARENT_IS_BEST:
        return rng.choice(others)
    return best


def inspirations(elites: list[dict], parent: dict | None, count: int = INSPIRATIONS) -> list[dict]:
    """One or two other elites to show beside the parent, fastest first."""
    return [e for e in elites if parent is None or e["number"] != parent["number"]][:count]


def entry_of(number: int, timing: dict[str, Any], sha256: str, description: str) -> dict:
    return {"number": number, "median_us": timing["median_us"], "iqr_us": timing.get("iqr_us"),
            "reps": timing.get("reps"), "sha256": sha256, "description": description[:200]}

