"""Searching a module target: the LLM agent writes a ModelNew for the module's KernelBench problem,
and the KernelBench-protocol eval judges it (five seeds, tolerances, a custom kernel must launch,
timed outputs checked, in the same isolated child processes as every candidate).

The problem (runs/<id>/problems/<slug>.py and its weights) is written when the run starts, from
the profiled model (autokernel.search.module_problem). No starter kernel fits an arbitrary module, so the
tuner has nothing to tune: a module target is skipped under `--agent tune`, and says so.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from autokernel.errors import TargetDone, UserError
from autokernel.judging.kb_evaluate import EvalOptions, RefCache, judge_file, resolve
from autokernel.search.loop import TargetSearch
from autokernel.search.proposer import SearchContext
from autokernel.search.run import RunDir, TargetState, target_slug

KERNEL_TYPE = "module"
TUNER_SKIP = ("a module target has no starter kernel for the tuner to tune: it is searched by the LLM "
              "agent (--agent llm)")
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
PROBLEMS = "problems"


# ---------------------------------------------------------------- the run's module targets
def module_state(entry: dict, name: str) -> TargetState:
    """A plan entry of a module target as the run's target; its problem is written by prepare()."""
    m = entry["module"]
    kwargs = {"qualname": m["qualname"], "class": m["class"], "label": m["label"],
              "modules": [x["name"] for x in entry.get("modules", [])], "bound": entry.get("bound"),
              "calls": entry.get("calls"), "problem": f"{PROBLEMS}/{target_slug(name)}.py",
              # how the plan counted its work, and where its products' rows are chosen by the data
              "work": entry.get("work_note"), "data_dependent": entry.get("data_dependent"),
              "matmuls": entry.get("matmuls")}
    return TargetState(name=name, kernel_type=KERNEL_TYPE, dims={}, dtype=entry["dtype"], rank=entry.get("rank", 0),
                       share=entry.get("share", 0.0), ceiling_speedup=entry.get("ceiling_speedup"), kwargs=kwargs)


def chain_state(row: dict, rank: int) -> TargetState:
    """A generic chain's plan row (autokernel.profile.generic_chains) as a module-style target: its
    problem replays the chain's ops (autokernel.search.chain_problem), written by prepare()."""
    name = row["target"]
    kwargs = {"chain": True, "ops": row.get("ops", []), "modules": [m["name"] for m in row.get("modules", [])],
              "calls": row.get("calls"), "problem": f"{PROBLEMS}/{target_slug(name)}.py"}
    return TargetState(name=name, kernel_type=KERNEL_TYPE, dims={}, dtype=row["dtype"], rank=rank,
                       share=min(row.get("share", 0.0), 1.0), ceiling_speedup=row.get("ceiling_speedup"), kwargs=kwargs)


def prepare(run: RunDir, targets: list[TargetState], model: Any, plan: dict, log: Any = None) -> None:
    """Write each module target's problem from the loaded model (a generic chain's from its plan
    row's replay); a module that cannot be rebuilt on its own is done at once, with the reason as
    its stop reason."""
    from autokernel.search import chain_problem
    from autokernel.search.module_problem import UnsupportedModule, write_problem
    inputs = {e["target"]: e["module"]["inputs"] for e in plan.get("entries", []) if e.get("kernel_type") == KERNEL_TYPE}
    replays = {r["target"]: r.get("replay") for r in (plan.get("chains") or {}).get("entries", [])}
    for t in targets:
        if t.kernel_type != KERNEL_TYPE:
            continue
        if t.kwargs.get("chain"):
            path = run.path / t.kwargs["problem"]
            chain_problem.write_problem(path.parent, path.stem, replays[t.name], t.name)
            continue
        instance = model.get_submodule(t.kwargs["qualname"])
        path = run.path / t.kwargs["problem"]
        try:
            if inputs.get(t.name.split("#")[0]) is None:
                raise UnsupportedModule("what the module was called with was not captured")
            write_problem(path.parent, path.stem, instance, inputs[t.name.split("#")[0]], t.name)
            path.with_suffix(".source.py").write_text(_source(type(instance)), encoding="utf-8")
        except UserError as e:
            t.status, t.stop_reason = "done", f"no problem could be made from {t.kwargs['qualname']}: {e.message}"
            if log:
                log(f"{t.name}: {t.stop_reason}")


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return f"# the source of {cls.__module__}.{cls.__qualname__} could not be read"


# ---------------------------------------------------------------- the search
class NoTuning:
    """The tuner's place on a module target: it proposes nothing (ModuleSearch stops first)."""

    name = "tune"

    def propose(self, ctx: SearchContext) -> Any:
        raise TargetDone(TUNER_SKIP)

    def observe(self, candidate: Any, verdict: dict | None) -> None:
        pass


class ModuleSearch(TargetSearch):
    """TargetSearch on a module target: no starter (the first proposal is the first kernel), and the
    KernelBench eval of the module's problem as the judge."""

    def __init__(self, run: RunDir, state: Any, target: TargetState, proposer: Any, settings: Any, **kwargs: Any):
        kwargs.pop("judge", None)
        kwargs["starter_source"] = ""
        super().__init__(run, state, target, proposer, settings, judge=self._judge_module, **kwargs)
        self.problem = run.path / target.kwargs["problem"]
        self.opts = resolve(EvalOptions(device=settings.device.split(":")[0],
                                        precision=PRECISIONS.get(target.dtype, "fp32"),
                                        timeout_s=settings.timeout_s or 300.0,
                                        compile_baseline=not settings.device.startswith("cpu")))
        self.cache = RefCache()
        if getattr(proposer, "name", "") == "llm":  # the generic LLM proposer asks for a kernel_fn
            self.proposer = module_proposer(proposer.client, run, target, self.opts.tolerance)

    def search(self) -> None:
        t = self.target
        if self.proposer.name != "llm":
            raise TargetDone(TUNER_SKIP)
        t.status, t.stop_reason = "searching", ""
        while True:
            self.check_stops()
            self.experiment(None)

    def _new_best(self, number: int, candidate: Any, verdict: dict) -> None:
        # no starter: PyTorch's own time for the module comes with the first passing ModelNew
        if self.target.eager_median_us is None:
            self.target.eager_median_us = (verdict.get("timing") or {}).get("baseline_median_us")
        super()._new_best(number, candidate, verdict)

    def _judge_module(self, kernel_file: Path, **_: Any) -> dict:
        return judge_file(kernel_file, problem=self.problem, opts=self.opts, cache=self.cache)

    def context(self, number: int) -> SearchContext:
        ctx = super().context(number)
        ctx.peaks = {**ctx.peaks, "module": self.target.kwargs}
        return ctx


def module_proposer(client: Any, run: RunDir, target: TargetState, tolerance: float):
    """The LLM proposer for a module target: KernelBench's prompt with the module's own source,
    recorded shapes and dtypes, and its share of the model's time."""
    from autokernel.search.llm_agent import LLMProposer
    problem = run.path / target.kwargs["problem"]

    def messages(ctx: SearchContext) -> list[dict[str, str]]:
        from autokernel.search.modelnew_agent import build_messages
        source = problem.with_suffix(".source.py").read_text(encoding="utf-8")
        brief = _chain_brief if target.kwargs.get("chain") else _problem_brief
        msgs = build_messages(ctx, brief(problem, target, source), tolerance)
        return msgs

    return LLMProposer(client, messages_for=messages)


def _problem_brief(problem: Path, target: TargetState, module_source: str) -> str:
    """What the prompt shows as the problem: the module's class source and how it is called."""
    import json
    facts = json.loads(problem.with_suffix(".json").read_text(encoding="utf-8"))
    call = list(enumerate(facts["call"]["args"])) + list(facts["call"]["kwargs"].items())
    shapes = "; ".join(f"{k}: {v['tensor']['shape']} {v['tensor']['dtype']}" if "tensor" in v else f"{k}: {v['const']!r}"
                       for k, v in call)
    kw = target.kwargs
    return (f"# Model is the module `{kw['qualname']}` ({kw['class']}) of the profiled model, its weights "
            f"copied; it takes {target.share:.1%} of the model's time over {kw.get('calls')} call(s) per "
            f"forward ({', '.join(kw.get('modules', [])[:4])}).\n"
            f"# forward(*inputs) is called with: {shapes}\n"
            f"# ModelNew.__init__ takes no arguments; keep the module's parameter and buffer names so "
            f"the judge copies its weights: {json.dumps(facts['names'])}\n"
            + (f"# Its work, as the plan counted it, {kw['work']}\n" if kw.get("work") else "")
            + _grouped_hint(kw)
            + f"# The module's class, as the model's code defines it:\n{module_source.rstrip()}\n")


def _chain_brief(problem: Path, target: TargetState, replay_source: str) -> str:
    """What the prompt shows of a generic chain: the ops it replays, in order, and its inputs."""
    import json
    facts = json.loads(problem.with_suffix(".json").read_text(encoding="utf-8"))
    shapes = "; ".join(f"{i}: {a['tensor']['shape']} {a['tensor']['dtype']}" for i, a in enumerate(facts["call"]["args"]))
    kw = target.kwargs
    where = f" in {', '.join(kw['modules'][:4])}" if kw.get("modules") else ""
    return (f"# Model is a chain of the profiled model's operators ({' > '.join(kw.get('ops', []))}){where}: each "
            f"intermediate is read only inside the chain, so one kernel can keep them on chip. It takes "
            f"{target.share:.1%} of the model's time over {kw.get('calls')} call(s) per step.\n"
            f"# forward(*inputs) is called with: {shapes}\n"
            f"# ModelNew.__init__ takes no arguments; the chain has no weights (what it reads are inputs).\n"
            f"# The chain's aten ops, as the model ran them:\n{replay_source.rstrip()}\n")


def _grouped_hint(kw: dict) -> str:
    """Where the module's products run on rows the data chose (an expert loop), the form to write."""
    if not kw.get("data_dependent") or not kw.get("matmuls"):
        return ""
    shapes = "; ".join(f"{m['op']}: M = {m['M']}" for m in kw["matmuls"])
    return (f"# After {kw['data_dependent']} its products run on rows the data chose, a different M per group and "
            f"per call (in the profile: {shapes}). Write one grouped GEMM over all groups (the rows sorted by "
            f"group, every group's weights in one launch), not one launch per group; each seed of the judge "
            f"draws another routing.\n")
