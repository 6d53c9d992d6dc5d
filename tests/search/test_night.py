"""A night that is spent, not abandoned: the run goes on until its budget is gone, revisiting a
plateaued target with other strategies, and stops early only to say why.

The real run (execute: scheduler, loop, leaderboard, state) with the LLM through the real openai
client against the loopback server; the judge is the loop's seam (a function of the kernel file),
and time is simulated: the judge and the LLM advance a clock the budget is charged by, so nothing
here waits or depends on the machine's speed."""
import json
from dataclasses import asdict

import pytest
from fake_openai import API_KEY, MODEL, error, fake_openai, reply  # noqa: F401  (fixture)
from loop_kernels import FAST, reply_with

from autokernel.search import leaderboard as board
from autokernel.search import run as runs
from autokernel.search import run_search
from autokernel.search import start as run_start
from autokernel.search.llm import LLMClient
from autokernel.search.run import RunState, TargetState

SOFTMAX = dict(kernel_type="softmax", dims={"M": 8, "N": 128}, dtype="float32", ceiling_speedup=4.0)


class SimClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Timed:
    """An LLMClient whose every reply takes `reply_s` of simulated time."""

    def __init__(self, client, clock, reply_s):
        self.client, self.clock, self.reply_s = client, clock, reply_s
        self.model = client.model

    @property
    def waited_s(self):
        return self.client.waited_s

    def query(self, messages):
        self.clock.now += self.reply_s
        return self.client.query(messages)


def never_faster_judge(clock, verdict_s=8.0):
    """Every candidate passes at the same 100 us (+- noise): correct, and never faster."""
    def judge(kernel_file, *, target, device, arch, timeout_s, **around):
        clock.now += verdict_s
        return {"verdict": "PASS", "failed_stage": None, "stages": [], "device": {"type": "cpu"},
                "timing": {"median_us": 100.0, "iqr_us": 4.0, "reps": 20, "baseline_median_us": 150.0,
                           "speedup_vs_eager": 1.5}, "roofline": {"bound": "memory"}}
    return judge


def new_run(tmp_path, targets, budget_s, **options):
    run = runs.RunDir(tmp_path / "run")
    run.create()
    state = RunState(run_id="run", agent="llm", budget_s=budget_s, targets=targets)
    opts = run_start.OptimizeOptions(agent="llm", llm=MODEL, budget_s=budget_s, **options)
    config = {"model": {"device": "cpu"}, "options": asdict(opts)}
    run.write_json(run.config_path, config)
    run.save_state(state)
    return run, state, config


def variant(n):
    return reply_with(f"Variant {n}: the same kernel, arranged differently.", FAST.replace('"""Softmax',
                                                                                             f'"""[{n}] Softmax', 1))


def test_a_never_faster_model_spends_the_budget_revisiting_with_other_strategies(tmp_path, fake_openai,
                                                                                monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    fake_openai.script(*[variant(n) for n in range(60)])
    clock = SimClock()
    client = Timed(LLMClient(MODEL, base_url=fake_openai.base_url), clock, reply_s=4.0)
    run, state, config = new_run(tmp_path, [TargetState(name="softmax[8x128:float32]", share=1.0, **SOFTMAX)],
                                 budget_s=300.0, base_url=fake_openai.base_url)
    state = run_search.execute(run, state, config, judge=never_faster_judge(clock), client=client, clock=clock)

    assert state.elapsed_s >= 0.85 * state.budget_s  # searched until the budget was (nearly) gone
    assert (state.status, state.stop_kind) == ("done", "budget") and "budget" in state.stop_reason
    t = state.targets[0]
    frame = board.read(run.leaderboard_path)
    strategies = list(dict.fromkeys(s for s in frame["strategy"] if s))
    assert strategies[:3] == ["refine", "next_tier", "different_algorithm"] and t.parks >= 2
    assert len(frame) == len(t.history) >= 20
    prompts = fake_openai.prompts()
    assert any("Strategy: the next tier" in p for p in prompts)
    assert any("Strategy: a different algorithm" in p and "Parent kernel: the starter" in p for p in prompts)
    assert any("Other good kernels of this search" in p for p in prompts)  # inspirations
    assert 2 <= len(t.elites) <= 4 and len({e["sha256"] for e in t.elites}) == len(t.elites)
    assert all(pd_int(p) is not None for p in frame["parent"][1:])  # every proposal has a parent
    saved = json.loads(run.state_path.read_text())
    assert saved["stop_kind"] == "budget" and saved["targets"][0]["parks"] == t.parks


def pd_int(value):
    return None if value != value or value is None else int(value)


@pytest.mark.parametrize("max_unusable, replies", [(None, 20), (7, 7)])  # the default, and --max-unusable 7
def test_a_model_that_never_answers_with_code_stops_and_names_itself(tmp_path, fake_openai, monkeypatch,
                                                                    max_unusable, replies):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    fake_openai.script(*["I would restructure the reduction, but here is only my advice."] * 30)
    clock = SimClock()
    client = Timed(LLMClient(MODEL, base_url=fake_openai.base_url), clock, reply_s=30.0)
    targets = [TargetState(name="softmax[8x128:float32]", share=0.6, **SOFTMAX),
               TargetState(name="softmax[8x128:float32]#2", share=0.4, **SOFTMAX)]
    chosen = {} if max_unusable is None else {"max_unusable": max_unusable}
    run, state, config = new_run(tmp_path, targets, budget_s=8 * 3600.0, base_url=fake_openai.base_url, **chosen)
    state = run_search.execute(run, state, config, judge=never_faster_judge(clock), client=client, clock=clock)

    assert (state.status, state.stop_kind) == ("stopped", "nothing_usable")
    assert len(fake_openai.requests) == replies  # replies in a row, across both targets
    assert f"{replies} replies in a row" in state.stop_reason
    assert {h.get("failed_stage") for t in state.targets for h in t.history[1:]} == {"parse"}
    assert all(t.history for t in state.targets)  # the streak counted across targets
    reason = state.stop_reason
    assert MODEL in reason and fake_openai.base_url in reason and "parse" in reason and "--agent tune" in reason
    assert clock.now < 20 * 60  # within minutes of (simulated) time, not the night
    from autokernel.cli import _after_search
    assert _after_search(run, state, config, tmp_path) == 1  # a failure, never "done"
    assert json.loads(run.state_path.read_text())["stop_kind"] == "nothing_usable"


def test_cut_off_replies_long_prompts_reasoning_and_a_stronger_model(tmp_path, fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    context = "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens."
    thinking = "Maybe:\n```python\nKERNEL_TYPE = 'softmax'\nBACKEND = 'triton'\n# rejected idea\n```\n"
    fake_openai.script(
        reply(variant(1)[:300], finish_reason="length"),  # 1: cut off inside its kernel
        error(400, message=context), reply(variant(2), reasoning_content=thinking),  # 2: asked again, smaller
        # a plateau (2 in a row): parked; each revisit asks the strong model
        *[reply(variant(n)) for n in range(3, 30)])
    clock = SimClock()
    clients = {name: Timed(LLMClient(name, base_url=fake_openai.base_url, max_tokens=900,
                                      reasoning_effort="high"), clock, reply_s=5.0)
               for name in ("cheap-model", "strong-model")}
    run, state, config = new_run(tmp_path, [TargetState(name="softmax[8x128:float32]", share=1.0, **SOFTMAX)],
                                 budget_s=100.0, base_url=fake_openai.base_url, plateau=2)
    state = run_search.execute(run, state, config, judge=never_faster_judge(clock), client=clients, clock=clock)

    frame = board.read(run.leaderboard_path)
    t = state.targets[0]
    assert frame["failed_stage"][1] == "truncated" and frame["verdict"][1] == "FAIL"
    requests = fake_openai.requests
    assert all(r["max_tokens"] == 900 and r["reasoning_effort"] == "high" for r in requests)
    text = [r["messages"][1]["content"] for r in requests]
    assert "cut off at the token limit" in text[1] and "cut off at the token limit" not in text[0]
    assert len(text[2]) < len(text[1])  # refused for its length, asked again smaller
    judged = run.experiment_file(t, 2).read_text()
    assert "[2] Softmax" in judged and "rejected idea" not in judged  # reasoning_content never parsed
    # nor read as part of the answer at all, before the reply's text or after it
    answer = run.experiment_file(t, 2, ".response.md").read_text()
    assert "Variant 2" in answer and "rejected idea" not in answer and "Maybe:" not in answer
    models = [r["model"] for r in requests]
    first_strong = models.index("strong-model")
    assert set(models[:first_strong]) == {"cheap-model"} and set(models[first_strong:]) == {"strong-model"}
    assert first_strong == 3 and t.parks >= 1  # the cheap model's 3 requests: one refused, two replies
    assert state.tokens["cheap-model"]["replies"] == 2 and state.tokens["cheap-model"]["completion_tokens"] > 0
    assert state.tokens["strong-model"]["replies"] == len(requests) - 3
    assert sum(int(n) for n in frame["completion_tokens"].dropna()) == sum(
        m["completion_tokens"] for m in state.tokens.values())


def test_a_target_no_prompt_fits_is_parked_with_the_reason(tmp_path, fake_openai, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    too_long = "prompt is too long: 200000 tokens > 131072 maximum"
    fake_openai.script(*[error(400, message=too_long)] * 3)
    run, state, config = new_run(tmp_path, [TargetState(name="softmax[8x128:float32]", share=1.0, **SOFTMAX)],
                                 budget_s=3600.0, base_url=fake_openai.base_url)
    clock = SimClock()
    state = run_search.execute(run, state, config, judge=never_faster_judge(clock),
                               client=LLMClient(MODEL, base_url=fake_openai.base_url), clock=clock)
    t = state.targets[0]
    assert len(fake_openai.requests) == 3  # the whole prompt, a smaller one, the smallest
    assert t.status == "parked" and "too long" in t.blocked and MODEL in t.blocked
    assert (state.stop_kind, state.status) == ("nothing_usable", "stopped") and "too long" in state.stop_reason


class Killed(BaseException):
    """Stands for kill -9 of the writer in the middle of a judge call."""


def test_resume_after_a_kill_keeps_the_elites_and_the_parked_targets(tmp_path):
    from autokernel.search import loop
    from autokernel.search.kernel_source import read_literals
    targets = [TargetState(name="softmax[8x128:float32]", share=0.6, **SOFTMAX),
               TargetState(name="softmax[8x128:float32]#2", share=0.4, **SOFTMAX)]
    run = runs.RunDir(tmp_path / "run")
    run.create()
    state = RunState(run_id="run", agent="tune", budget_s=3600.0, targets=targets)
    run.write_json(run.config_path, {"options": {"budget_s": 3600.0}})
    calls, clock = [], SimClock()

    def judge(kernel_file, *, target, device, arch, timeout_s, **around):
        calls.append(kernel_file)
        clock.now += 10.0
        if len(calls) == 9:
            raise Killed()
        config = read_literals(kernel_file.read_text())["CONFIG"]
        median_us = 50.0 + config["num_warps"] / 100  # every configuration within 10% of another
        return {"verdict": "PASS", "failed_stage": None, "stages": [], "device": {"type": "cpu"},
                "timing": {"median_us": median_us, "iqr_us": 5.0, "reps": 20, "baseline_median_us": 100.0,
                           "speedup_vs_eager": 100.0 / median_us}}

    settings = loop.SearchSettings(plateau=2, max_experiments=8, clock=clock)
    make = run_search.proposer_factory("tune", seed=0)
    with pytest.raises(Killed):
        run_search.search_all(run, state, settings, make, starter_source=run_search.starter_sources(run), judge=judge)
    saved = runs.RunDir(run.path).load_state()  # what kill -9 leaves: the state as last saved
    a, b = saved.targets
    assert a.parks >= 1 and b.parks >= 1 and len(a.elites) >= 2 and len(b.elites) >= 2
    assert {a.status, b.status} <= {"parked", "searching", "waiting"} and a.strategy and b.strategy

    _, resumed, _ = run_start.resume(tmp_path, "run")
    assert [t.elites for t in resumed.targets] == [a.elites, b.elites]
    assert [(t.parks, t.status, t.strategy) for t in resumed.targets] == [(a.parks, a.status, a.strategy),
                                                                          (b.parks, b.status, b.strategy)]
    run_search.search_all(run, resumed, settings, make, starter_source=run_search.starter_sources(run), judge=judge)
    for before, after in zip((a, b), resumed.targets):
        assert after.parks >= before.parks and after.status == "done"
        assert all(e in after.elites for e in before.elites if e["median_us"] <= after.elites[-1]["median_us"])
    frame = board.read(run.leaderboard_path)
    assert {"tune", "reseed"} <= set(frame["strategy"]) and frame["experiment"].is_unique is False  # two targets


def test_a_run_from_before_the_scheduler_resumes(tmp_path):
    """state.json without the scheduler's fields and a leaderboard without parent and strategy, as
    the search wrote them before: the run resumes, and its new rows carry the new columns."""
    from autokernel.search import loop
    run = runs.RunDir(tmp_path / "run")
    run.create()
    state = RunState(run_id="run", agent="tune", budget_s=3600.0,
                     targets=[TargetState(name="softmax[8x128:float32]", share=1.0, **SOFTMAX)])
    run.write_json(run.config_path, {"options": {"budget_s": 3600.0}})
    clock = SimClock()
    settings = loop.SearchSettings(max_experiments=2, clock=clock)
    make = run_search.proposer_factory("tune", seed=0)
    run_search.search_all(run, state, settings, make, starter_source=run_search.starter_sources(run),
                          judge=never_faster_judge(clock))
    old = json.loads(json.dumps(runs.RunDir(run.path).load_state().to_json(), default=str))  # snapshot + journal
    new_fields = ("stop_kind", "unusable_in_a_row", "last_unusable", "tokens")
    target_fields = ("elites", "parks", "strategy", "chosen_because", "stint_start", "blocked", "ideas")
    old = {k: v for k, v in old.items() if k not in new_fields}
    old["targets"] = [{k: v for k, v in t.items() if k not in target_fields} for t in old["targets"]]
    for t in old["targets"]:
        t["status"] = "searching"
        for h in t["history"]:
            h["row"] = {k: v for k, v in h["row"].items() if k not in ("parent", "strategy")}
    run.state_path.write_text(json.dumps(old))  # a state.json of version 1: no journal continues it
    run.journal_path.unlink()
    frame = board.read(run.leaderboard_path)
    lines = ["\t".join(board.escape(r[c]) if r[c] == r[c] else "" for c in board.SEALED_COLUMNS)
             for r in frame.to_dict("records")]
    run.leaderboard_path.write_text("\t".join(board.SEALED_COLUMNS) + "\n" + "\n".join(lines) + "\n")

    _, resumed, _ = run_start.resume(tmp_path, "run")
    settings.max_experiments = 4
    run_search.search_all(run, resumed, settings, make, starter_source=run_search.starter_sources(run),
                          judge=never_faster_judge(clock))
    frame = board.read(run.leaderboard_path)
    assert list(frame["experiment"]) == [0, 1, 2, 3, 4]
    assert set(frame["strategy"][:3]) == {""} and set(frame["strategy"][3:]) == {"tune"}
    t = resumed.targets[0]
    assert t.status == "done" and len(t.elites) >= 1
    from autokernel.search.seal import check_run
    assert check_run(run.path).errors == []


def test_the_run_starts_no_experiment_that_cannot_end_before_the_budget(tmp_path):
    """Ten-minute verdicts and a quarter of an hour: after the baseline, five minutes are left and
    the scheduler stops, where round robin starts another verdict and runs five minutes over."""
    from autokernel.errors import BudgetExhausted
    from autokernel.search import loop, schedule
    spent = {}
    for name, policy in (("new", schedule.choose), ("round robin", schedule.round_robin)):
        run = runs.RunDir(tmp_path / name)
        run.create()
        state = RunState(run_id=name, agent="tune", budget_s=900.0,
                         targets=[TargetState(name="softmax[8x128:float32]", share=1.0, **SOFTMAX)])
        run.write_json(run.config_path, {"options": {"budget_s": 900.0}})
        clock = SimClock()
        with pytest.raises(BudgetExhausted) as stop:
            run_search.search_all(run, state, loop.SearchSettings(clock=clock),
                                  run_search.proposer_factory("tune", seed=0),
                                  starter_source=run_search.starter_sources(run),
                                  judge=never_faster_judge(clock, 600.0), choose=policy)
        spent[name] = (state.elapsed_s, str(stop.value))
    assert spent["new"][0] == 600.0 and "too little for any target's next experiment" in spent["new"][1]
    assert spent["round robin"][0] == 1200.0  # the plain policy runs over
