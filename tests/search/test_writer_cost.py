"""The writer's work per experiment does not grow with the run: counted, never timed.

A run of tens of thousands of experiments is affordable only if each experiment's bookkeeping
(context, parent, record, state, scheduler's record) reads a fixed number of history entries. The
search runs for real (the LLM agent's loop, one at a time and with judge slots) against an LLM
that answers at once and a judge that answers from the experiment's number; the target's history
counts every entry read, and the reads per experiment early in the run are compared with those
late in it."""
import hashlib

import pytest

from autokernel.search import loop, run_search
from autokernel.search import run as runs
from autokernel.search.llm import Reply
from autokernel.search.run import RunState, TargetState
from autokernel.search.slots import LocalSlots, local_slots
from starter_kernels import starter_path

TARGET = dict(name="softmax[8x128:float32]", kernel_type="softmax", dims={"M": 8, "N": 128},
              dtype="float32", share=1.0)
EXPERIMENTS = 120
EARLY, LATE = range(10, 50), range(EXPERIMENTS - 40, EXPERIMENTS)


class CountedHistory(list):
    """A history that counts the entries read from it (by index, slice or iteration)."""

    reads = 0

    def __getitem__(self, key):
        got = super().__getitem__(key)
        self.reads += len(got) if isinstance(key, slice) else 1
        return got

    def __iter__(self):
        for entry in super().__iter__():
            self.reads += 1
            yield entry


class InstantLLM:
    """Replies at once with the starter, a little changed each time."""

    def __init__(self, source):
        self.source, self.calls = source, 0

    def query(self, messages):
        self.calls += 1
        text = f"Variant {self.calls}.\n```python\n{self.source}\n# variant {self.calls}\n```\n"
        return Reply(text=text, prompt_tokens=100, completion_tokens=50, seconds=0.0)


def judge(kernel_file, *, target, device, arch, timeout_s, visible_devices=None):
    """From the file's text: one in four fails, the rest pass at a time drawn from its hash, so
    some are kept, most reverted, and the elites change now and then."""
    digest = hashlib.sha256(kernel_file.read_bytes()).digest()
    if digest[0] % 4 == 0 and not kernel_file.name.startswith("exp_0000"):
        return {"verdict": "FAIL", "failed_stage": "smoke", "stages": [], "timing": None, "roofline": None,
                "device": {"type": "cpu"}, "message": "wrong values"}
    median_us = 40.0 + int.from_bytes(digest[1:3], "big") / 6553.6
    return {"verdict": "PASS", "failed_stage": None, "stages": [],
            "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 20, "baseline_median_us": 100.0,
                       "speedup_vs_eager": 100.0 / median_us},
            "roofline": {"bound": "memory"}, "device": {"type": "cpu"}}


def reads_per_experiment(tmp_path, monkeypatch, slots):
    """The history entries read between one recorded experiment and the next, by experiment."""
    source = starter_path("softmax").read_text()
    run = runs.RunDir(tmp_path / "run")
    run.create()
    target = TargetState(**TARGET)
    target.history = history = CountedHistory()
    state = RunState(run_id="run", agent="llm", budget_s=1e9, targets=[target])
    settings = loop.SearchSettings(max_experiments=EXPERIMENTS, plateau=10**9, concurrency=slots)
    at_record = []
    record = loop.TargetSearch._record

    def counted(self, *args, **kwargs):
        try:
            return record(self, *args, **kwargs)
        finally:
            at_record.append(history.reads)
    monkeypatch.setattr(loop.TargetSearch, "_record", counted)
    pool = LocalSlots(judge, local_slots("cpu", slots)) if slots > 1 else None
    try:
        make = run_search.proposer_factory("llm", seed=0, client=InstantLLM(source))
        run_search.search_all(run, state, settings, make, starter_source=lambda t: source, judge=judge, slots=pool)
    finally:
        if pool is not None:
            pool.close()
    assert target.history is history and len(history) == EXPERIMENTS + 1  # the baseline and every proposal
    assert any(h["decision"] == "KEEP" for h in history) and any(h["verdict"] == "FAIL" for h in history)
    return [after - before for before, after in zip(at_record, at_record[1:])]


@pytest.mark.parametrize("slots", [1, 4])
def test_the_history_entries_read_per_experiment_do_not_grow_with_the_run(tmp_path, monkeypatch, slots):
    reads = reads_per_experiment(tmp_path, monkeypatch, slots)
    early, late = (sum(reads[i] for i in window) / len(window) for window in (EARLY, LATE))
    # a walk of the history reads one more entry per experiment already recorded: 50 to 70 more an
    # experiment late than early here; a fixed window reads the same few throughout (with slots, a
    # few proposals made ahead may fall on either side of a window's edge, hence the slack)
    assert late - early <= loop.HISTORY_WINDOW / 2, (early, late, reads)
    assert early <= 4 * loop.HISTORY_WINDOW, (early, reads)
