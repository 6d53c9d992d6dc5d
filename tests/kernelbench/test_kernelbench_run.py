"""`autokernel kernelbench run`: problems matched to starters, the tuner on a wrapped starter with a
resume, the LLM agent through a local OpenAI-compatible server, and the run's kernelbench.json."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from fake_openai import API_KEY, MODEL, fake_openai, reply  # noqa: F401  (fixture)

from autokernel.judging import kb_evaluate
from autokernel.kernelbench import run as kb_run
from autokernel.kernelbench.adapters import match_problem, wrap_starter
from autokernel.kernelbench.score import fast_p, load_results
from paths import KERNELBENCH

HERE = KERNELBENCH
FAST = dict(device="cpu", reps=3, warmup=1, timeout_s=60, compile_baseline=False)

PROBLEMS = {
    "softmax": ("torch.softmax(x, dim=0)", "[torch.randn(40, 3)]", "", "softmax"),
    "matmul": ("torch.matmul(A, B)", "[torch.randn(2, 5, 24), torch.randn(24, 7)]", "", "matmul"),
    "matmul_t": ("torch.matmul(A.T, B)", "[torch.randn(24, 9), torch.randn(24, 7)]", "", "matmul"),
    "sum": ("torch.sum(x, dim=self.dim, keepdim=True)", "[torch.randn(4, 33, 5)]", "self.dim = 1", "reduce"),
    "layernorm": ("self.ln(x)", "[torch.randn(3, 4, 5, 6)]", "self.ln = nn.LayerNorm((5, 6))", "layernorm"),
    "xent": ("torch.nn.functional.cross_entropy(predictions, targets)",
             "[torch.randn(8, 10), torch.randint(0, 10, (8,))]", "", "cross_entropy"),
}


def _problem(expr: str, inputs: str, init: str) -> str:
    params = "predictions, targets" if "predictions" in expr else "A, B" if "A" in expr else "x"
    return textwrap.dedent(f"""\
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super(Model, self).__init__()
                {init or "pass"}

            def forward(self, {params}):
                return {expr}


        def get_inputs():
            return {inputs}


        def get_init_inputs():
            return []
        """)


def test_matching_and_wrapped_starters_compute_models_output(tmp_path):
    from starter_kernels import starter_path
    files = []
    for name, (expr, inputs, init, kind) in PROBLEMS.items():
        source = _problem(expr, inputs, init)
        match = match_problem(source)
        assert match is not None and match.kernel_type == kind, name
        wrapped = wrap_starter(source, match, starter_path(kind).read_text())
        assert "class ModelNew(Model):" in wrapped and wrapped.count("\nCONFIG = ") == 1
        (tmp_path / f"{name}.py").write_text(wrapped + f"\n\ndef get_inputs():\n    return {inputs}\n")
        files.append(str(tmp_path / f"{name}.py"))
    for other in ("torch.relu(x)", "torch.bmm(A, B)", "torch.sum(x, dim=(1, 2))", "torch.softmax(x, dim=1, dtype=torch.float64)"):
        assert match_problem(_problem(other, "[]", "")) is None, other
    assert match_problem((HERE / "level1" / "23_Softmax.py").read_text()).kernel_type == "softmax"
    assert match_problem((HERE / "level2" / "12_Gemm_Multiply_LeakyReLU.py").read_text()) is None
    # every wrapper, run under the interpreter, equals its Model
    script = textwrap.dedent("""\
        import importlib.util, sys, torch
        for path in sys.argv[1:]:
            spec = importlib.util.spec_from_file_location("w", path)
            m = importlib.util.module_from_spec(spec); sys.modules["w"] = m; spec.loader.exec_module(m)
            torch.manual_seed(0); inputs = m.get_inputs()
            torch.manual_seed(1); ref = m.Model()(*inputs)
            torch.manual_seed(1); out = m.ModelNew()(*inputs)
            assert out.shape == ref.shape and out.dtype == ref.dtype, path
            assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4), (path, (out - ref).abs().max())
        print("all equal")
        """)
    done = subprocess.run([sys.executable, "-c", script, *files], capture_output=True, text=True,
                          env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and "all equal" in done.stdout, done.stderr[-2000:]


def _kb_dir(tmp_path: Path, *names: str) -> Path:
    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    for name in names:
        shutil.copy(HERE / "level1" / name, level / name)
    return tmp_path


def test_tuner_run_on_a_wrapped_starter_then_resume(tmp_path):
    kb = _kb_dir(tmp_path, "19_ReLU.py", "23_Softmax.py")
    runs = tmp_path / "runs"
    options = kb_run.KBRunOptions(agent="tune", max_experiments=0, **FAST)
    run, state, config = kb_run.start(kb, 1, "19,23", options, runs)
    state = kb_run.execute(run, state, config)
    relu, softmax = state.targets
    assert state.status == "done"
    assert relu.status == "done" and "the tuner needs one" in relu.stop_reason and relu.history == []
    assert [(h["decision"], h["verdict"]) for h in softmax.history] == [("BASELINE", "PASS")]
    starter = (run.path / "kernels" / "23_Softmax" / "exp_0000.py").read_text()
    assert 'KERNEL_TYPE = "softmax"' in starter and "class ModelNew(Model):" in starter
    meta, results = load_results(run.path / "kernelbench.json")
    assert meta["agent"] == "tune" and [r.key for r in results] == ["19_ReLU", "23_Softmax"]
    assert [r.correct for r in results] == [False, True] and fast_p(results, 0) == 0.5
    assert (run.path / results[1].solution).read_text() == starter

    # as if killed during the search of 23_Softmax: the resume goes on from experiment 1
    state.targets[1].status, state.targets[1].stop_reason = "searching", ""
    run.save_state(state)
    run, state, config = kb_run.resume(runs, run.run_id, {"max_experiments": 1})
    state = kb_run.execute(run, state, config)
    softmax = state.targets[1]
    assert [h["number"] for h in softmax.history] == [0, 1] and state.sessions == 2
    assert softmax.history[1]["verdict"] == "PASS" and softmax.history[1]["decision"] in ("KEEP", "REVERT")
    tuned = (run.path / "kernels" / "23_Softmax" / "exp_0001.py").read_text()
    changed = [(a, b) for a, b in zip(starter.splitlines(), tuned.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("CONFIG = ")  # the tuner moves CONFIG only
    rows = (run.path / "leaderboard.tsv").read_text().splitlines()
    assert len(rows) == 3 and all(r.split("\t")[2] == "23_Softmax" for r in rows[1:])


def test_llm_agent_writes_modelnew_from_the_problem(tmp_path, fake_openai, monkeypatch):  # noqa: F811
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    solution = (HERE / "solutions" / "19_ReLU_correct.py").read_text()
    fake_openai.script(reply(f"ReLU as one Triton pass.\n```python\n{solution}```\n"))
    kb = _kb_dir(tmp_path, "19_ReLU.py")
    options = kb_run.KBRunOptions(agent="llm", llm=MODEL, base_url=fake_openai.base_url, max_experiments=1, **FAST)
    run, state, config = kb_run.start(kb, 1, None, options, tmp_path / "runs")
    state = kb_run.execute(run, state, config)
    relu = state.targets[0]
    assert [(h["decision"], h["verdict"]) for h in relu.history] == [("KEEP", "PASS")]
    prompt = fake_openai.prompts()[0]
    assert "return torch.relu(x)" in prompt and "None yet: write the first one" in prompt
    assert (run.path / "kernels" / "19_ReLU" / "exp_0000.prompt.md").exists()
    summary = json.loads((run.path / "kernelbench.json").read_text())
    row = summary["problems"][0]
    assert row["correct"] is True and row["speedup_vs_eager"] > 0 and row["solution"] == "best/19_ReLU.py"
    assert (run.path / "best" / "19_ReLU.py").read_text() == solution


def test_two_workers_judge_two_solutions_at_once_with_one_writer(tmp_path, monkeypatch):
    # Both slots must be inside the judge at the same time: each of the first two slot calls waits
    # at a barrier for the other (one slot at a time would break it), so the test does not depend on
    # how long a judgement takes.
    meeting, slot_calls = threading.Barrier(2, timeout=300), []
    real = kb_evaluate.evaluate

    def evaluate(*args, **kwargs):
        if threading.current_thread().name.startswith("judge-slot"):
            slot_calls.append(threading.current_thread().name)
            if len(slot_calls) <= 2:
                meeting.wait()
        return real(*args, **kwargs)
    monkeypatch.setattr(kb_evaluate, "evaluate", evaluate)
    kb = _kb_dir(tmp_path, "23_Softmax.py")
    options = kb_run.KBRunOptions(agent="tune", max_experiments=2, workers=2, **FAST)
    run, state, config = kb_run.start(kb, 1, None, options, tmp_path / "runs")
    assert config["options"]["workers"] == 2
    state = kb_run.execute(run, state, config)
    softmax = state.targets[0]
    assert not meeting.broken and len(slot_calls) == 2 and len(set(slot_calls)) == 2
    assert [h["number"] for h in softmax.history] == [0, 1, 2] and softmax.pending == []
    assert [h["verdict"] for h in softmax.history] == ["PASS"] * 3
    rows = [r.split("\t") for r in (run.path / "leaderboard.tsv").read_text().splitlines()[1:]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    sources = [(run.path / "kernels" / "23_Softmax" / f"exp_000{n}.py").read_text() for n in (1, 2)]
    configs = [source.split("\nCONFIG = ")[1].split("\n")[0] for source in sources]
    assert configs[0] != configs[1]  # the tuner never proposes a configuration already in flight
    summary = json.loads((run.path / "kernelbench.json").read_text())
    assert summary["problems"][0]["experiments"] == 3 and summary["problems"][0]["correct"] is True


def test_the_summary_reads_each_best_verdict_once_and_again_when_it_changes(tmp_path, monkeypatch):
    # kernelbench.json is rewritten after every experiment: reading every problem's best verdict
    # each time would cost a read per problem per experiment
    from autokernel.search.run import RunDir, RunState, TargetState
    run = RunDir(tmp_path / "run")
    run.create()
    targets = [TargetState(name=f"{n}_P", kernel_type="kernelbench", dims={}, dtype="fp32", best_experiment=0)
               for n in (1, 2)]
    for t, speedup in zip(targets, (1.5, 2.5)):
        run.kernels(t).mkdir()
        run.write_json(run.experiment_file(t, 0, ".json"), {"verdict": "PASS", "correct": True,
                                                             "speedup_vs_eager": speedup})
    config = {"level": 1, "options": {"precision": "fp32", "device": "cpu"},
              "problems": [{"key": t.name, "problem_id": i, "name": t.name, "level": 1} for i, t in enumerate(targets)]}
    state = RunState(run_id="run", agent="llm", targets=targets)
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or read_text(self, *a, **k))
    for _ in range(5):
        kb_run.write_summary(run, state, config)
    assert sorted(reads) == ["exp_0000.json", "exp_0000.json"]  # once per problem, not once per write
    run.write_json(run.experiment_file(targets[1], 0, ".json"), {"verdict": "PASS", "correct": True,
                                                                  "speedup_vs_eager": 3.0})
    kb_run.write_summary(run, state, config)
    summary = json.loads((run.path / "kernelbench.json").read_text())
    assert [p["speedup_vs_eager"] for p in summary["problems"]] == [1.5, 3.0]
