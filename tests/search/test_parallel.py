"""Experiments in flight at once: judge slots, one writer, numbers, the guard, resume, Ray.

The search runs for real (tuner, loop, leaderboard, state, guard); the judge is a function of each
file's CONFIG (the loop's judge seam) wherever the real judge is not the point, with gates that
force verdicts to come back out of order, so nothing here depends on timing or load."""
import json
import os
import re
import sys
import threading

import pytest
from fake_openai import fake_openai  # noqa: F401  (fixture)

from autokernel.search import leaderboard as board
from autokernel.search import loop, run_search
from autokernel.search import run as runs
from autokernel.search import start as run_start
from autokernel.errors import UsageError, UserError
from autokernel.search.kernel_source import read_literals
from autokernel.search.run import RunState, TargetState
from autokernel.search.seal import check_run
from autokernel.search.slots import LocalSlots, local_slots, make_slots, parse_devices
from paths import ROOT

TARGET = dict(name="softmax[8x128:float32]", kernel_type="softmax", dims={"M": 8, "N": 128},
              dtype="float32", share=1.0)
GATE_S = 60  # a gate that never opens fails the test instead of hanging it


def number_of(kernel_file) -> int:
    return int(re.search(r"exp_(\d+)", str(kernel_file)).group(1))


def cost_us(config):
    return 10.0 + config["BLOCK_N"] / 512 + config["num_warps"]


class StubJudge:
    """Verdicts from CONFIG; counts calls in flight; `hold_until` = {n: m} keeps experiment n's
    verdict back until experiment m's is returned (out of order on purpose); with `meet`, a proposal's
    call (not a starter's: those are judged alone) waits, up to GATE_S, until that many calls are in
    flight, once: a scheduler that hands two slots their candidates together is seen doing so however
    loaded the machine is, and one that does not is seen not to."""

    def __init__(self, hold_until=None, on_call=None, meet=0):
        self.hold_until = hold_until or {}
        self.on_call = on_call or (lambda number, kernel_file: None)
        self.returned = {}
        self.lock = threading.Lock()
        self.active = self.max_active = 0
        self.met = threading.Event()
        self.meet = meet

    def event(self, number):
        with self.lock:
            return self.returned.setdefault(number, threading.Event())

    def __call__(self, kernel_file, *, target, device, arch, timeout_s):
        number = number_of(kernel_file)
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            if self.active >= self.meet:
                self.met.set()
        try:
            if number >= 1 and not self.met.wait(GATE_S):
                self.met.set()  # never met: the rest go on alone, and max_active says so
            if number in self.hold_until:
                assert self.event(self.hold_until[number]).wait(GATE_S), "the gate never opened"
            self.on_call(number, kernel_file)
            median_us = cost_us(read_literals(kernel_file.read_text())["CONFIG"])
            return {"verdict": "PASS", "failed_stage": None, "stages": [],
                    "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 20, "baseline_median_us": 100.0,
                               "speedup_vs_eager": 100.0 / median_us},
                    "roofline": {"bound": "memory"}, "device": {"type": "cpu"}}
        finally:
            with self.lock:
                self.active -= 1
            self.event(number).set()


def new_run(tmp_path, name="run"):
    run = runs.RunDir(tmp_path / name)
    run.create()
    state = RunState(run_id=name, agent="tune", targets=[TargetState(**TARGET)])
    run.save_state(state)
    return run, state


def search(run, state, judge, workers, max_experiments=8):
    settings = loop.SearchSettings(max_experiments=max_experiments, plateau=99)
    slots = LocalSlots(judge, local_slots("cpu", workers))
    try:
        run_search.search_all(run, state, settings, run_search.proposer_factory("tune", seed=0),
                              starter_source=run_search.starter_sources(run), judge=judge, slots=slots)
    finally:
        slots.close()


def rows(run):
    frame = board.read(run.leaderboard_path).drop(columns=["timestamp"])
    return frame.astype(str).to_dict("records")


def test_two_slots_write_what_one_writes_in_number_order(tmp_path):
    one, one_state = new_run(tmp_path, "one")
    search(one, one_state, StubJudge(), workers=1)
    two, two_state = new_run(tmp_path, "two")
    gated = StubJudge(hold_until={1: 2, 3: 4})  # 1 and 3 come back after 2 and 4
    search(two, two_state, gated, workers=2)

    assert gated.max_active == 2  # two candidates were judged at once
    assert rows(two) == rows(one)  # the same proposals, verdicts, decisions, hashes, in order
    numbers = [int(n) for n in board.read(two.leaderboard_path)["experiment"]]
    assert numbers == list(range(9))
    t = two_state.targets[0]
    assert t.status == "done" and "experiment budget spent (8 per target)" in t.stop_reason
    assert t.pending == [] and t.next_experiment == 9
    configs = [json.dumps(h["config"], sort_keys=True) for h in t.history[1:]]
    assert len(set(configs)) == 8  # nothing proposed twice while in flight
    kept = [h["median_us"] for h in t.history if h["decision"] in ("BASELINE", "KEEP")]
    assert kept == sorted(kept, reverse=True) and t.best_median_us == kept[-1]
    assert two.best_file(t).read_text() == two.experiment_file(t, t.best_experiment).read_text()
    assert check_run(two.path).errors == []


def test_a_candidate_that_writes_the_run_fails_and_the_run_is_put_back(tmp_path):
    run, state = new_run(tmp_path)

    def tamper(number, kernel_file):
        if number == 2:
            (run.path / "leaderboard.tsv").write_text("forged\n")

    # 1 is held until 2 returned: both are in flight when 2 writes, so both are charged with it
    search(run, state, StubJudge(hold_until={1: 2}, on_call=tamper), workers=2, max_experiments=4)
    frame = board.read(run.leaderboard_path)
    assert [int(n) for n in frame["experiment"]] == [0, 1, 2, 3, 4]
    failed = frame[frame["failed_stage"] == "integrity"]
    assert set(failed["experiment"].astype(int)) == {1, 2}
    assert set(frame[frame["experiment"].astype(int) > 2]["verdict"]) == {"PASS"}  # the run goes on
    verdict = json.loads(run.experiment_file(state.targets[0], 2, ".json").read_text())
    assert "leaderboard.tsv" in verdict["stages"][-1]["detail"]
    assert check_run(run.path).errors == []


class Killed(BaseException):
    """Stands for the writer's death while candidates are in flight."""


def test_resume_judges_what_was_in_flight_under_its_own_numbers(tmp_path):
    run, state = new_run(tmp_path)

    def die(number, kernel_file):
        if number == 4:
            raise Killed()

    with pytest.raises(Killed):  # 3 is held until 4 returns: both in flight at the "kill"
        search(run, state, StubJudge(hold_until={3: 4}, on_call=die), workers=2, max_experiments=6)
    saved = run.load_state()  # what a kill -9 leaves: state.json as last saved
    t = saved.targets[0]
    assert [h["number"] for h in t.history] == [0, 1, 2]
    assert sorted(p["number"] for p in t.pending) == [3, 4] and t.next_experiment == 5
    before = rows(run)

    run.write_json(run.config_path, {"options": {"budget_s": 3600.0}})
    _, resumed, _ = run_start.resume(tmp_path, "run")
    search(run, resumed, StubJudge(), workers=2, max_experiments=6)
    after = rows(run)
    assert after[:3] == before  # no recorded row lost or changed
    assert [int(r["experiment"]) for r in after] == list(range(7))  # no number reused, none skipped
    t = resumed.targets[0]
    assert t.pending == [] and t.proposals == 6
    assert len({json.dumps(h["config"], sort_keys=True) for h in t.history[1:]}) == 6
    assert check_run(run.path).errors == []


def test_a_pending_candidate_whose_file_changed_is_dropped_not_judged(tmp_path):
    run, state = new_run(tmp_path)
    with pytest.raises(Killed):
        search(run, state, StubJudge(on_call=lambda n, f: (_ for _ in ()).throw(Killed()) if n == 2 else None),
               workers=2, max_experiments=4)
    saved = run.load_state()
    numbers = sorted(p["number"] for p in saved.targets[0].pending)
    assert 2 in numbers
    run.experiment_file(saved.targets[0], 2).write_text("# changed after it was submitted\n")
    search(run, saved, StubJudge(), workers=2, max_experiments=4)
    recorded = [int(n) for n in board.read(run.leaderboard_path)["experiment"]]
    assert 2 not in recorded and len(recorded) == len(set(recorded)) == 5
    assert recorded == sorted(recorded) and max(recorded) > 4  # 2 stays unused, never handed out again


# ------------------------------------------------------------------ choosing slots
def test_slots_per_device():
    assert [s.device for s in local_slots("cpu", 2)] == ["cpu", "cpu"]
    assert [s.index for s in local_slots("cuda", 1, ["0", "3"])] == ["0", "3"]
    assert [s.index for s in local_slots("cuda", 3)] == ["0", "1", "2"]
    assert [s.index for s in local_slots("cuda", 1)] == [None]  # one GPU: the judge's own choice
    assert parse_devices("0, 2") == ["0", "2"]
    for bad in ("", "a,b", "0,0", "-1"):
        with pytest.raises(UsageError):
            parse_devices(bad)
    with pytest.raises(UsageError, match="--devices names CUDA devices"):
        local_slots("cpu", 1, ["0"])


def test_a_cuda_slot_pins_the_judges_child_to_its_gpu():
    from harness.judge import child_env
    assert child_env("cuda", "3")["CUDA_VISIBLE_DEVICES"] == "3"
    seen = {}
    slots = LocalSlots(lambda path, **kw: seen.update(kw) or {}, local_slots("cuda", 1, ["5"]))
    from autokernel.search.slots import JudgeJob
    slots.submit(JudgeJob(path=None, source="", case=None, arch="sm_90", timeout_s=1)).result(timeout=GATE_S)
    slots.close()
    assert seen["visible_devices"] == "5" and seen["device"] == "cuda"


def test_ray_without_ray_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(UserError) as e:
        make_slots(StubJudge(), "cpu", ray_address="auto")
    assert "not installed" in e.value.message and "autokernel[ray]" in e.value.hint


# ------------------------------------------------------------------ end to end, the real judge
@pytest.mark.slow
def test_two_workers_survive_a_killed_judge_and_a_kill_9(tmp_path):
    import signal

    from loop_kernels import SOFTMAX_MODEL
    from processes import WAIT_S, end_orphans, judge_workers, judging, start, wait_for
    model = tmp_path / "softmax_model.py"
    model.write_text(SOFTMAX_MODEL)
    runs_dir = tmp_path / "runs"
    first = start([str(model), "--agent", "tune", "--max-experiments", "4", "--workers", "2",
                   "--timeout", "300", "--device", "cpu"], runs_dir)
    run = wait_for(first, runs_dir, judging(1), "experiment 1's judge")
    for pid, command in judge_workers(run).items():  # one slot's worker dies mid-candidate
        if "exp_0001.py" in command:
            os.kill(pid, signal.SIGKILL)

    def recorded(number):
        def ready(folder):
            path = folder / board.FILENAME
            return path.exists() and number in set(board.read(path)["experiment"].astype(int))
        return ready
    wait_for(first, runs_dir, recorded(1), "experiment 1's row")
    first.kill()  # kill -9 of the writer, with candidates in flight
    first.communicate(timeout=60)
    end_orphans(run)
    before = board.read(run / board.FILENAME).drop(columns=["timestamp"]).astype(str).to_dict("records")

    second = start(["--resume", run.name, "--workers", "2"], runs_dir)
    out, err = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, err
    frame = board.read(run / board.FILENAME)
    after = frame.drop(columns=["timestamp"]).astype(str).to_dict("records")
    assert after[:len(before)] == before  # nothing recorded was lost or rewritten
    assert [int(n) for n in frame["experiment"]] == [0, 1, 2, 3, 4]
    crashed = frame[frame["experiment"].astype(int) == 1].iloc[0]
    assert crashed["verdict"] == "CRASH" and crashed["decision"] == "REVERT"
    assert set(frame[frame["experiment"].astype(int) != 1]["verdict"]) == {"PASS"}  # the search went on
    state = json.loads((run / "state.json").read_text())
    target = state["targets"][0]
    assert state["status"] == "done" and target["pending"] == [] and target["next_experiment"] == 5
    configs = {json.dumps(read_literals((run / c).read_text())["CONFIG"], sort_keys=True)
               for c in frame["candidate"][1:]}
    assert len(configs) == 4
    assert check_run(run).errors == []


@pytest.fixture
def local_ray():
    ray = pytest.importorskip("ray")
    from pathlib import Path
    root = str(ROOT)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": root}})
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_the_same_search_on_a_local_ray_cluster(tmp_path, local_ray):
    run, state = new_run(tmp_path)
    slots = make_slots(None, "cpu", ray_address="auto")  # the Ray this process started
    assert slots.width == 2  # one actor per CPU of the cluster
    def no_local_judge(*args, **kwargs):
        raise AssertionError("a candidate was judged outside the Ray cluster")
    try:
        run_search.search_all(run, state, loop.SearchSettings(max_experiments=2, plateau=99),
                              run_search.proposer_factory("tune", seed=0),
                              starter_source=run_search.starter_sources(run), judge=no_local_judge, slots=slots)
    finally:
        slots.close()
    frame = board.read(run.leaderboard_path)
    assert [int(n) for n in frame["experiment"]] == [0, 1, 2]
    assert set(frame["verdict"]) == {"PASS"} and list(frame["decision"])[0] == "BASELINE"
    t = state.targets[0]
    assert t.status == "done" and t.pending == []
    verdict = json.loads(run.experiment_file(t, 2, ".json").read_text())
    assert verdict["kernel_file"] == str(run.experiment_file(t, 2))  # the run's file, not the actor's copy
    assert verdict["timing"]["median_us"] > 0 and verdict["device"]["type"] == "cpu"
    if os.environ.get("AUTOKERNEL_JUDGE_FORK", "1") != "0":  # each actor forks its workers, as a local run does
        workers = [json.loads(run.experiment_file(t, n, ".json").read_text())["judge_seconds"]["worker"]
                   for n in range(3)]
        assert workers == ["fork"] * 3, workers
    assert check_run(run.path).errors == []


# ------------------------------------------------------------------ the LLM agent, requests in flight
def test_llm_requests_in_flight_at_once(tmp_path, fake_openai, monkeypatch):
    from fake_openai import API_KEY, MODEL, reply
    from loop_kernels import FAST, WRONG, reply_with

    from autokernel.search.llm import LLMClient
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    fake_openai.script(reply(reply_with("Pack rows.", FAST)), reply(reply_with("Skip the division.", WRONG)),
                       reply("No code this time."), reply(reply_with("Pack rows again.", FAST)))
    client = LLMClient(MODEL, base_url=fake_openai.base_url)
    both = threading.Barrier(2, timeout=GATE_S)  # the first two requests must be out together

    class Gated:
        waited_s = 0.0

        def __init__(self):
            self.asked, self.lock = 0, threading.Lock()

        def query(self, messages):
            with self.lock:
                self.asked += 1
                first_two = self.asked <= 2
            if first_two:
                both.wait()
            return client.query(messages)

    def judge(kernel_file, *, target, device, arch, timeout_s):
        median_us = 100.0 if number_of(kernel_file) == 0 else 50.0
        return {"verdict": "PASS", "failed_stage": None, "stages": [], "device": {"type": "cpu"},
                "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 20, "baseline_median_us": 100.0}}

    run, state = new_run(tmp_path)
    state.agent = "llm"
    settings = loop.SearchSettings(max_experiments=4, plateau=99, concurrency=2)
    slots = LocalSlots(judge, local_slots("cpu", 1))
    try:
        run_search.search_all(run, state, settings, run_search.proposer_factory("llm", 0, Gated()),
                              starter_source=run_search.starter_sources(run), judge=judge, slots=slots)
    finally:
        slots.close()
    frame = board.read(run.leaderboard_path)
    assert [int(n) for n in frame["experiment"]] == [0, 1, 2, 3, 4]
    assert sorted(frame["description"][1:]) == sorted(["Pack rows.", "Skip the division.",
                                                       "No code this time.", "Pack rows again."])
    assert list(frame["failed_stage"]).count("parse") == 1
    assert list(frame["decision"]).count("KEEP") == 1  # only the first 50 us beats the 100 us best
    t = state.targets[0]
    for n in range(1, 5):  # each number kept its own prompt and reply
        assert run.experiment_file(t, n, ".response.md").exists()
    assert check_run(run.path).errors == []


def test_devices_on_the_cpu_are_refused_before_profiling(tmp_path):
    import subprocess
    from pathlib import Path

    from loop_kernels import SOFTMAX_MODEL
    root = ROOT
    model = tmp_path / "softmax_model.py"
    model.write_text(SOFTMAX_MODEL)
    done = subprocess.run([sys.executable, "-m", "autokernel", "optimize", str(model), "--device", "cpu",
                           "--devices", "0,1", "--runs-dir", str(tmp_path / "runs")], cwd=root, text=True,
                          capture_output=True, timeout=GATE_S, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode != 0 and "--devices names CUDA devices" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_two_slots_and_the_scheduler_share_the_night_between_targets(tmp_path):
    run = runs.RunDir(tmp_path / "run")
    run.create()
    state = RunState(run_id="run", agent="tune", targets=[
        TargetState(**{**TARGET, "share": 0.5, "ceiling_speedup": 20.0}),
        TargetState(**{**TARGET, "name": "softmax[8x128:float32]#2", "share": 0.4, "ceiling_speedup": 20.0})])
    settings = loop.SearchSettings(max_experiments=6, plateau=2)
    judge = StubJudge(meet=2)
    slots = LocalSlots(judge, local_slots("cpu", 2))
    try:
        run_search.search_all(run, state, settings, run_search.proposer_factory("tune", seed=0),
                              starter_source=run_search.starter_sources(run), judge=judge, slots=slots)
    finally:
        slots.close()
    assert judge.max_active == 2
    frame = board.read(run.leaderboard_path)
    for t in state.targets:  # each target: its numbers in order, none lost or twice
        numbers = [int(n) for n in frame[frame["target"] == t.name]["experiment"]]
        assert numbers == list(range(7)) and t.pending == [] and t.status == "done"
    # the scheduler moved between them while candidates were in flight
    assert (frame["target"] != frame["target"].shift()).sum() > 2
    assert check_run(run.path).errors == []
