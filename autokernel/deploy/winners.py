"""A run's winners: each target's best kernel on disk with what routing needs to know of it (its
plan entry's route and modules, its serving range), and the kernels imported to run.

`verify` and `export` read the winners from here. A winner's serving range (autokernel/deploy/routing/
serving.py) is read from its best experiment's verdict: the target's timing and the shapes around
it the judge checked and timed when the kernel was kept (the verdict's "timing_around"). A verdict
from before serving ranges has none: its winner serves its target's shape alone, and every other
call falls back saying so. A winner whose backward passed has a training serving range too: the
target and the shapes around it where the judge found its backward right (the verdict's
"backward"."around"); a call that needs gradients outside it falls back, counted.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

# a generic chain's winner is judged, not bound (autokernel.profile.generic_chains says why)
from autokernel.profile.generic_chains import NOT_BOUND as GENERIC_NOT_SERVED
from autokernel.search.run import RunDir, target_slug

OLD_RECORD = "a record from before serving ranges: the target's shape alone"


@dataclass
class WinnerFile:
    """A target's best kernel on disk, with what routing and the projection need to know of it."""

    target: str
    kernel_type: str
    dims: dict
    dtype: str
    path: Path
    kwargs: dict = field(default_factory=dict)
    route: str = "op"
    modules: list = field(default_factory=list)
    share: float = 0.0
    speedup_vs_eager: Optional[float] = None
    experiment: Optional[int] = None
    serving: Optional[dict] = None  # ServingRange.to_json(); None for a module target
    backward: bool = False  # its backward_fn passed the judge: it serves calls that need gradients
    training_serving: Optional[dict] = None  # where those calls are served: where the backward was right
    judged_layouts: bool = False  # its backward was judged under column-major and broadcast grad_outs
    inference_only: str = ""  # why a backward_fn the file gives does not serve ('' when it does, or has none)
    unrun_dtype: str = ""  # why its own dtype was never run by the judge ('' when it was)
    not_served: str = ""  # why it is not bound: a chain and its members' winners measured against each other
    decision: Optional[dict] = None  # a chain's: which of it and its members serves, with both figures

    @property
    def module_name(self) -> str:
        return "autokernel_winner_" + target_slug(self.target).replace("-", "_").replace(".", "_").replace("=", "_")


def winner_files(run: RunDir) -> list[WinnerFile]:
    """Every target with a best kernel, in plan order, joined with its plan entry (route, modules)."""
    state, plan = run.load_state(), _read_json(run.plan_path)
    by_rank = {e.get("rank"): e for e in plan.get("entries", [])}
    by_name = {e.get("target"): e for e in plan.get("entries", [])}
    chains = {r.get("target"): r for r in (plan.get("chains") or {}).get("entries", [])}
    found = []
    for t in state.targets:
        path = run.best_file(t)
        if t.best_experiment is None or not path.is_file():
            continue
        if t.name in chains and t.kernel_type == chains[t.name].get("chain_type"):
            entry = {"route": CHAIN_ROUTES.get(t.kernel_type, "pattern"), **chains[t.name]}
        else:
            entry = by_rank.get(t.rank) or by_name.get(t.name.split("#")[0].replace(",causal]", "]"), {})
        verdict = _read_json(run.experiment_file(t, t.best_experiment, ".json"))
        backward, inference_only = backward_state(path, t.kernel_type, verdict)
        found.append(WinnerFile(target=t.name, kernel_type=t.kernel_type, dims=dict(t.dims), dtype=t.dtype,
                                path=path, kwargs=_serving_kwargs(run, t), route=entry.get("route") or "op",
                                modules=list(entry.get("modules", [])), share=t.share,
                                speedup_vs_eager=t.speedup_vs_eager, experiment=t.best_experiment,
                                serving=serving_range(t, verdict), backward=backward,
                                training_serving=training_serving_range(t, verdict) if backward else None,
                                judged_layouts=backward and bool((verdict.get("backward") or {})
                                                                 .get("grad_out_layouts")),
                                inference_only=inference_only, unrun_dtype=unrun_dtype(verdict),
                                not_served=GENERIC_NOT_SERVED if t.kwargs.get("chain") else ""))
    choose_alternatives(found, plan)
    return found


# how a chain's form binds (autokernel/deploy/routing/calls.py and chain_forms.py): rotary_qk through
# the function the attention module calls (apply_rotary_pos_emb), silu_mul as the gated MLP's forward,
# add_rmsnorm as the pre-norm decoder layer's, linear_cross_entropy as the causal LM's (its loss)
CHAIN_ROUTES = {"rotary_qk": "pattern", "silu_mul": "module", "add_rmsnorm": "module",
                "linear_cross_entropy": "module"}


def saving(f: WinnerFile) -> Optional[float]:
    """The share of the end-to-end time a winner saves where it serves: share x (1 - 1/speedup),
    its speedup over PyTorch's op as measured (None when unmeasured). Speeds count as served: a
    winner slower than PyTorch's op is not served for speed, so it saves nothing (not a negative
    share)."""
    s = f.speedup_vs_eager
    return f.share * (1.0 - 1.0 / max(s, 1.0)) if s else None


def choose_alternatives(found: list[WinnerFile], plan: dict) -> list[dict]:
    """A chain and its members (chain_plan.members) run the same ops: serving both would bind two
    kernels to one call. For each chain with a winner, the side that saves more of the end-to-end
    time by its measured figures is served; the other's winners are marked `not_served` with both
    figures. A side with no figure loses to one with a figure; a tie keeps the members (the
    model's own ops), as does a chain no form can bind in a model yet (its winner is then not
    served at all, saying so, rather than failing verify for serving nothing). With CPU figures
    (the Triton interpreter, every kernel far slower than PyTorch's op) no time says anything of a
    GPU, and, as serving there, correctness decides: the chain is served, the fused form the search
    is for. Returns the decisions, one per chain with a winner, as verify records them."""
    from autokernel.profile.chain_plan import members
    by_target = {f.target: f for f in found}
    decisions = []
    for row in (plan.get("chains") or {}).get("entries", []):
        chain = by_target.get(row.get("target"))
        if chain is None or chain.not_served:
            continue
        names = set(row.get("members") or members(row, plan.get("entries", [])))
        rivals = [f for f in found if f.target.split("#")[0] in names and not f.not_served]
        chain_saves = saving(chain)
        rival_saves = [saving(f) for f in rivals]
        members_save = sum(x for x in rival_saves if x is not None) if any(x is not None for x in rival_saves) else None
        decision = {"chain": chain.target, "members": [f.target for f in rivals], "chain_saves": chain_saves,
                    "members_save": members_save}
        if not bindable(chain.kernel_type):
            decision.update(served="members" if rivals else "neither",
                            why=f"no form binds {chain.kernel_type} chains in a model yet")
        elif not rivals:
            decision.update(served="chain", why="no member of the chain has a winner")
        elif plan.get("cpu_figures"):
            decision.update(served="chain", why="CPU figures (Triton interpreter): no time measured here says "
                                                "which side is faster on a GPU, so correctness decides, as it "
                                                "does for serving on the CPU, and the fused chain is served")
        elif chain_saves is not None and (members_save is None or chain_saves > members_save):
            decision.update(served="chain", why=f"the chain saves {_pct(chain_saves)} of the end-to-end time, its "
                                                f"members' winners {_pct(members_save)}")
        else:
            decision.update(served="members", why=f"its members' winners save {_pct(members_save)} of the end-to-end "
                                                  f"time, the chain {_pct(chain_saves)}")
        losers = rivals if decision["served"] == "chain" else [chain]
        both = f"the {chain.target} chain and its members run the same ops; " if rivals else ""
        for f in losers:
            f.not_served = f"not served: {both}{decision['why']}"
        chain.decision = decision
        decisions.append(decision)
    return decisions


def unbound_chains(files: list[WinnerFile], tally: dict) -> dict[str, str]:
    """Bound chains that served no call because their form fits no call of this model (a layer
    with other arguments than the form reads: a hand-written decoder layer called with (x, cos,
    sin)), and the reason: their members' winners can serve those calls instead."""
    from autokernel.deploy.routing.router import UNBOUND_WORDS
    found = {}
    for f in files:
        k = (tally.get("per_kernel") or {}).get(f.target)
        if not f.decision or f.decision.get("served") != "chain" or f.not_served or not k or k["calls_served"]:
            continue
        reasons = k.get("fallback_reasons") or {}
        if reasons and all(str(r).endswith(UNBOUND_WORDS) for r in reasons):
            found[f.target] = max(reasons, key=reasons.get)
    return found


def members_instead(files: list[WinnerFile], chain_target: str, why: str) -> None:
    """The chain's form binds no call of this model (`why`, verify's finding): its members' winners
    are bound in its place, and the chain is not (its decision updated, as verify.json records it;
    export reads it there)."""
    chain = next((f for f in files if f.target == chain_target and f.decision), None)
    if chain is None:
        return
    chain.decision.update(served="members" if chain.decision["members"] else "neither", why=why)
    chain.not_served = f"not served: {why}"
    lost = f"not served: the {chain_target} chain"
    for f in files:
        if f.target in chain.decision["members"] and f.not_served.startswith(lost):
            f.not_served = ""


def bindable(kernel_type: str) -> bool:
    """Whether the router can bind a winner of this type into a model: a hand-written form of it
    (routing/calls.py FORMS) or a torch op it serves (routing/binding.py KINDS)."""
    from autokernel.deploy.routing.binding import KINDS
    from autokernel.deploy.routing.calls import FORMS
    return kernel_type in FORMS or kernel_type in KINDS.values()


def _pct(x: Optional[float]) -> str:
    return "an unmeasured share" if x is None else f"{x:+.3%}"


def unrun_dtype(verdict: dict) -> str:
    """Why a winner may not serve its own dtype: its verdict judged another dtype in its place (a
    verdict from before the judge ran bf16 dot products in the interpreter, or from a GPU without
    bf16), so a PASS would rest on a dtype that was never run ('' when its own dtype was run)."""
    stood_in = verdict.get("stand_in_for")
    if not stood_in:
        return ""
    return (f"not served: its verdict ran {verdict.get('judged_dtype') or 'another dtype'} in place of {stood_in}, "
            f"so its {stood_in} path was never judged; judge it again (the judge now runs {stood_in} itself)")


def backward_state(path: Path, kernel_type: str, verdict: dict) -> tuple[bool, str]:
    """(whether the file's backward_fn serves calls that need gradients, why not in words). Only a
    backward the judge passed serves: one that failed, or that no judge saw (a verdict from before
    backward gating), leaves its winner serving inference alone."""
    from autokernel.search.decision import has_backward
    if kernel_type == "module" or not has_backward(path.read_text(encoding="utf-8")):
        return False, ""
    judged = verdict.get("backward")
    if not isinstance(judged, dict) or not judged.get("verdict"):
        return False, "inference only: the backward was not judged"
    if judged["verdict"] == "PASS":
        return True, ""
    return False, f"inference only: the backward failed {judged.get('failed_stage') or judged['verdict']}"


def serving_range(target: Any, verdict: dict) -> Optional[dict]:
    """The winner's serving range (as JSON) from its best verdict; None for a module target. Its
    target's own timing counts as a measured shape too: on a GPU a winner slower than PyTorch there
    does not serve there."""
    from autokernel.deploy.routing.serving import FREE_DIMS, ServingRange, Shape
    if target.kernel_type not in FREE_DIMS:
        return None
    timing = verdict.get("timing") or {}
    representative = bool(timing.get("representative_of_gpu"))
    shapes = [Shape(dict(target.dims), True, timing.get("median_us"), timing.get("baseline_median_us"),
                    _not_slower(timing, representative), "the target")]
    around = verdict.get("timing_around") or {}
    for row in around.get("shapes") or []:
        if row.get("ok") or row.get("failed"):  # neither: not checked, so it proves nothing either way
            shapes.append(Shape(dict(row["dims"]), bool(row.get("ok")), row.get("median_us"),
                                row.get("baseline_median_us"), _not_slower(row, representative) if row.get("ok")
                                else None, row.get("detail", "")))
    where = "on a GPU" if representative else "in the Triton interpreter (correctness only: its times say nothing)"
    if len(shapes) > 1:
        note = f"judged at the target and {len(shapes) - 1} shape(s) around it {where}"
    elif around.get("skipped"):
        note = f"the target's shape alone: the shapes around it were not timed ({around['skipped']})"
    else:
        note = OLD_RECORD
    return ServingRange(target.kernel_type, target.dtype, dict(target.dims), target.kwargs.get("causal"), shapes,
                        representative, note).to_json()


def training_serving_range(target: Any, verdict: dict) -> Optional[dict]:
    """Where a winner serves calls that need gradients (as JSON): the target, where its backward
    passed, and each shape around it where the judge checked the backward (correctness alone: a
    training call's speed is the step's, not measured per shape); None for a module target."""
    from autokernel.deploy.routing.serving import FREE_DIMS, ServingRange, Shape
    if target.kernel_type not in FREE_DIMS:
        return None
    shapes = [Shape(dict(target.dims), True, detail="the target")]
    around = ((verdict.get("backward") or {}).get("around") or {}).get("shapes") or []
    for row in around:
        if row.get("ok") or row.get("failed"):  # neither: not checked, so it proves nothing either way
            shapes.append(Shape(dict(row["dims"]), bool(row.get("ok")), detail=row.get("detail", "")))
    note = (f"the backward judged at the target and {len(shapes) - 1} shape(s) around it" if len(shapes) > 1
            else "the target alone: the backward was judged at no shape around it")
    return ServingRange(target.kernel_type, target.dtype, dict(target.dims), target.kwargs.get("causal"), shapes,
                        False, note).to_json()


def _not_slower(figures: dict, representative: bool) -> Optional[bool]:
    """Whether the kernel was not slower than PyTorch's op there beyond the noise of both medians
    (None where the times say nothing: the interpreter's)."""
    from autokernel.search.decision import notch_us
    median, base = figures.get("median_us"), figures.get("baseline_median_us")
    if not representative or not median or not base:
        return None
    reps = figures.get("reps")
    low = median - notch_us(median, figures.get("iqr_us"), reps)
    high = base + notch_us(base, figures.get("baseline_iqr_us"), figures.get("baseline_reps", reps))
    return low <= high


def _serving_kwargs(run: RunDir, target: Any) -> dict:
    """The target's options; a module target's also carry the call its problem was made from."""
    kwargs = dict(target.kwargs)
    if target.kernel_type == "module" and kwargs.get("problem"):
        facts = (run.path / kwargs["problem"]).with_suffix(".json")
        kwargs["call"] = json.loads(facts.read_text(encoding="utf-8"))["call"] if facts.is_file() else None
    return kwargs


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------- what this machine can run
def not_runnable(f: WinnerFile, device: str) -> str:
    """Why this machine does not run a winner at all ('' when it does): one whose own dtype the judge
    never ran serves nowhere, as export leaves it out."""
    if f.unrun_dtype:
        return f.unrun_dtype
    if device.startswith("cuda"):
        return ""
    source = f.path.read_text(encoding="utf-8")
    if re.search(r"""^BACKEND\s*=\s*["']cuda["']""", source, re.M):
        return "not run: a CUDA C++ kernel needs a GPU"
    return ""


def load_winners(files: list[WinnerFile]) -> tuple[list, dict[str, str]]:
    """The kernels imported in this process, and why any failed to import (it is then guilty)."""
    from autokernel.deploy import routing
    from autokernel.deploy.routing import refusals
    from autokernel.deploy.routing.serving import ServingRange
    from harness.correctness import served
    # the judge's launch monitor, before the first winner is imported, and its op recorder around
    # every served call, as in the exported package: a winner sees what it saw judged
    refusals.observe_with(served.watch(refusals.report))
    winners, failed = [], {}
    for f in files:
        try:
            module = routing.load_kernel(f.path, f.module_name, "ModelNew" if f.kernel_type == "module" else "kernel_fn")
        except Exception as e:  # noqa: BLE001 (a judged file should import; report whatever it raised)
            failed[f.target] = f"importing {f.path.name} raised {type(e).__name__}: {e}"
            continue
        backward_fn = getattr(module, "backward_fn", None) if f.backward else None
        mutates = getattr(module, "MUTATES_GRAD_OUT", False) is True
        if f.kernel_type == "module":  # a module winner is its ModelNew class, built per recorded instance
            kernel_fn = module.ModelNew
        else:
            kernel_fn = module.kernel_fn
        winners.append(routing.Winner(target=f.target, kernel_type=f.kernel_type, dims=f.dims, dtype=f.dtype,
                                      kernel_fn=kernel_fn, kwargs=f.kwargs, route=f.route, modules=f.modules,
                                      serving=ServingRange.from_json(f.serving) if f.serving else None,
                                      backward_fn=backward_fn, inference_only=f.inference_only,
                                      training_serving=ServingRange.from_json(f.training_serving)
                                      if f.training_serving else None, mutates_grad_out=mutates,
                                      judged_layouts=f.judged_layouts))
    return winners, failed
