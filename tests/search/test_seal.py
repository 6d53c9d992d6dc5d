"""Sealed records: the forged-records probe against a real run, and the search keeping a candidate
from changing the run's records while it is judged.

The probe: a candidate, at import, (a) appended a forged row (experiment 99, KEEP, PASS, 0.5 us),
(b) overwrote best/<target>.py with a kernel never judged, (c) rewrote its own exp_0001.py. Each
must be refused by `leaderboard --check`, verify, export and --resume, naming the file."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import API_KEY, MODEL, fake_openai, reply  # noqa: F401  (fixture)
from loop_kernels import CHEAT, FAST, SOFTMAX_MODEL, reply_with
from sealed_runs import tuned_run

from autokernel.deploy import export as exporter
from autokernel.search import leaderboard as board
from autokernel.search import loop, run_search
from autokernel.search import run as runs
from autokernel.search import start as run_start
from autokernel.search import seal
from autokernel.deploy import verify as verifier
from autokernel.errors import UserError
from autokernel.search.guard import RecordGuard
from autokernel.search.llm import LLMClient
from autokernel.profile.modelfile import spec_from_options
from paths import KERNELBENCH, ROOT

SLUG = "softmax-16x256-float32"
TARGET = "softmax[16x256:float32]"


def autokernel(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "autokernel", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory):
    """A real run: the offline tuner on a one-op softmax model, the baseline and one experiment."""
    root = tmp_path_factory.mktemp("seal")
    model = root / "softmax_model.py"
    model.write_text(SOFTMAX_MODEL)
    proc = autokernel("optimize", model, "--agent", "tune", "--max-experiments", "1", "--top", "1",
                      "--device", "cpu", "--timeout", "300", "--runs-dir", root / "runs", "--plain")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in (root / "runs").iterdir() if p.is_dir()]
    return run


@pytest.fixture
def run_copy(honest_run, tmp_path):
    """A copy of the honest run to forge, under a runs folder of its own (for --resume)."""
    copy = tmp_path / "runs" / honest_run.name
    shutil.copytree(honest_run, copy)
    return copy


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def forged_row(run, candidate=f"kernels/{SLUG}/exp_0099.py", sha256=""):
    row = board.make_row(experiment=99, target=TARGET, kernel_type="softmax", agent="tune", decision="KEEP",
                         verdict={"verdict": "PASS", "timing": {"median_us": 0.5}, "device": {"type": "cpu"}},
                         candidate=candidate, description="forged", source_sha256=sha256)
    board.Leaderboard(run / board.FILENAME).append(row)


def refused_everywhere(run, named):
    """--check (the CLI, as a user runs it), verify, export and --resume all refuse, naming `named`."""
    checked = autokernel("leaderboard", "--check", run, timeout=120)
    assert checked.returncode == 1, checked.stdout
    assert named in checked.stderr and "not sealed" in checked.stderr
    with pytest.raises(seal.SealError, match="verify refused") as refused:
        verifier.verify(run)
    assert named in refused.value.message
    with pytest.raises(seal.SealError, match="export refused") as refused:
        exporter.export(run, run.parent.parent / "exported")
    assert named in refused.value.message and not (run.parent.parent / "exported").exists()
    with pytest.raises(seal.SealError, match="--resume refused") as refused:
        run_start.resume(run.parent, run.name)
    assert named in refused.value.message


# ------------------------------------------------------------------ the honest run
@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_the_honest_run_is_sealed(honest_run):
    frame = board.read(honest_run / board.FILENAME)
    assert list(frame["experiment"]) == [0, 1]
    for _, row in frame.iterrows():
        assert row["source_sha256"] == sha(honest_run / row["candidate"])
    best = seal.best_kept_rows(frame)[TARGET]
    assert sha(honest_run / "best" / f"{SLUG}.py") == best["source_sha256"]
    checked = autokernel("leaderboard", "--check", honest_run, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert "sealed" in checked.stdout and "0 error(s), 0 unsealed" in checked.stdout
    assert seal.check_run(honest_run).ok


# ------------------------------------------------------------------ the probe, each forgery alone
@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_a_forged_row_is_refused_naming_its_missing_file(run_copy):
    forged_row(run_copy)
    refused_everywhere(run_copy, f"kernels/{SLUG}/exp_0099.py")


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_a_forged_row_with_a_file_and_its_true_hash_is_still_refused(run_copy):
    # the forger writes the file and its real sha256: the search's own state.json never recorded it
    path = run_copy / "kernels" / SLUG / "exp_0099.py"
    path.write_text(CHEAT)
    forged_row(run_copy, sha256=sha(path))
    report = seal.check_run(run_copy)
    assert any("#99 is not in state.json" in e for e in report.errors)
    assert any(e.startswith(f"best/{SLUG}.py") for e in report.errors)  # best/ is not row 99's text
    refused_everywhere(run_copy, "#99")


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_an_unjudged_best_file_is_refused_naming_it(run_copy):
    (run_copy / "best" / f"{SLUG}.py").write_text(CHEAT)  # PyTorch's compute: never judged
    refused_everywhere(run_copy, f"best/{SLUG}.py")


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_a_rewritten_experiment_file_is_refused_naming_it(run_copy):
    path = run_copy / "kernels" / SLUG / "exp_0001.py"
    path.write_text(path.read_text() + "\n# rewritten\n")
    refused_everywhere(run_copy, f"kernels/{SLUG}/exp_0001.py")


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_bytecode_planted_beside_a_checked_file_is_refused(run_copy):
    # Python would import a cache whose recorded mtime and size match the file instead of its text
    (run_copy / "best" / "__pycache__").mkdir()
    (run_copy / "best" / "__pycache__" / f"{SLUG}.cpython-312.pyc").write_bytes(b"\0" * 16)
    refused_everywhere(run_copy, "best/__pycache__/")


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_a_row_pointing_at_another_file_or_repeated_or_a_failed_keep_is_reported(run_copy):
    lines = (run_copy / board.FILENAME).read_text().splitlines(keepends=True)
    kept = lines[1].replace("\tBASELINE\tPASS\t", "\tKEEP\tFAIL\t")
    pointed = lines[2].replace(f"kernels/{SLUG}/exp_0001.py", f"best/{SLUG}.py")
    (run_copy / board.FILENAME).write_text(lines[0] + kept + pointed + lines[2])
    errors = seal.check_run(run_copy).errors
    assert any("#0 is a KEEP whose verdict is FAIL" in e for e in errors)
    assert any(f"#1 points at best/{SLUG}.py" in e for e in errors)
    assert any("#1 appears more than once" in e for e in errors)


# ------------------------------------------------------------------ runs from before rows were sealed
@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_an_old_leaderboard_is_reported_unsealed_and_can_still_be_resumed(run_copy):
    # an old run: neither a judged dtype nor a hash column in the leaderboard, none in state.json's rows
    path = run_copy / board.FILENAME
    width = len(board.LEGACY_COLUMNS)
    old = ["\t".join(line.rstrip("\n").split("\t")[:width]) + "\n" for line in path.read_text().splitlines(True)]
    path.write_text("".join(old))
    state = json.loads((run_copy / "state.json").read_text())
    for h in state["targets"][0]["history"]:
        del h["row"]["source_sha256"], h["row"]["judged_dtype"]
    (run_copy / "state.json").write_text(json.dumps(state))
    assert board.read(path)["source_sha256"].tolist() == ["", ""]
    report = seal.check_run(run_copy)
    assert report.errors == [] and len(report.unsealed) == 2 and not report.ok
    checked = autokernel("leaderboard", "--check", run_copy, timeout=120)
    assert checked.returncode == 1 and "unsealed" in checked.stderr and "exp_0000.py" in checked.stderr
    with pytest.raises(seal.SealError, match="verify refused"):
        verifier.verify(run_copy)
    notes = []
    run_start.resume(run_copy.parent, run_copy.name, log=notes.append)
    assert "2 row(s)" in notes[0] and "no source_sha256" in notes[0]
    # the next row a resumed search appends upgrades the header; the old rows stay unsealed
    forged_row(run_copy, sha256="ab" * 32)
    assert path.read_text().splitlines()[0] == board.HEADER.rstrip("\n")
    assert board.read(path)["source_sha256"].tolist() == ["", "", "ab" * 32]


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_a_run_written_before_the_state_journal_is_checked_verified_exported_and_resumed(run_copy):
    # the layout of earlier runs: state.json whole (version 1, its history without the hashes of
    # verdicts, prompts and replies) and no state.journal
    state = runs.RunDir(run_copy).load_state().to_json()
    state["version"] = 1
    for h in state["targets"][0]["history"]:
        del h["files"]
    (run_copy / "state.json").write_text(json.dumps(state, indent=1))
    (run_copy / "state.journal").unlink()
    checked = autokernel("leaderboard", "--check", run_copy, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert verifier.verify(run_copy)["status"] in ("ok", "partial")  # not refused
    assert exporter.export(run_copy, run_copy.parent.parent / "exported")["kernels"]
    run, resumed, _ = run_start.resume(run_copy.parent, run_copy.name)
    run.save_state(resumed)  # the first save writes the new layout
    assert json.loads((run_copy / "state.json").read_text())["version"] == runs.STATE_VERSION
    assert runs.RunDir(run_copy).load_state().to_json()["targets"] == resumed.to_json()["targets"]


@pytest.mark.slow  # the honest run: about a minute in the Triton interpreter
def test_a_hash_stripped_from_a_row_is_refused(run_copy):
    path = run_copy / board.FILENAME
    lines = path.read_text().splitlines(keepends=True)
    cells = lines[2].rstrip("\n").split("\t")
    cells[board.COLUMNS.index(board.HASH_COLUMN)] = ""
    path.write_text(lines[0] + lines[1] + "\t".join(cells) + "\n")
    refused_everywhere(run_copy, "#1 has another source_sha256 than state.json")


def test_an_old_header_is_upgraded_by_the_next_append_and_a_torn_row_dropped(tmp_path):
    path = tmp_path / board.FILENAME
    row = board.make_row(experiment=0, target=TARGET, kernel_type="softmax", agent="tune", decision="BASELINE",
                         verdict={"verdict": "PASS", "timing": {"median_us": 3.0}}, candidate="c", description="a\tb")
    old = "\t".join(board.escape(row.get(c)) for c in board.LEGACY_COLUMNS) + "\n"
    path.write_text(board.LEGACY_HEADER + old + old[:20])  # the last row torn by a crash
    board.Leaderboard(path).append({**row, "experiment": 1, "source_sha256": "cd" * 32})
    assert path.read_text().startswith(board.HEADER)
    frame = board.read(path)
    assert list(frame["experiment"]) == [0, 1] and list(frame["source_sha256"]) == ["", "cd" * 32]
    assert list(frame["description"]) == ["a\tb", "a\tb"]
    with pytest.raises(UserError, match="does not start with the leaderboard header"):
        (tmp_path / "other.tsv").write_text("experiment\tsomething\n")
        board.Leaderboard(tmp_path / "other.tsv").append(row)


def test_the_guard_sees_a_same_size_rewrite_whose_times_were_put_back(tmp_path):
    record = tmp_path / "best" / "k.py"
    record.parent.mkdir()
    record.write_text("original")
    guard = RecordGuard(tmp_path).snapshot()
    assert guard.restore() == []
    guard.snapshot()
    st = record.stat()
    record.write_text("forgery!")  # the same size
    os.utime(record, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert guard.restore() == ["best/k.py"] and record.read_text() == "original"
    guard.snapshot()
    os.mkfifo(tmp_path / "best" / "pipe")  # reading it would block the search forever
    os.symlink(record, tmp_path / "best" / "link.py")
    assert guard.restore() == ["best/link.py", "best/pipe"] and os.listdir(tmp_path / "best") == ["k.py"]


# ------------------------------------------------------------------ the search's own writes
def judge_stub(median_us=50.0, tamper=None, judged_sha=None):
    """A judge for the loop's seam: PASS at `median_us`; `tamper(kernel_file)` runs while judging,
    as a candidate's import would."""
    def judge(kernel_file, *, target, device, arch, timeout_s):
        if tamper is not None:
            tamper(Path(kernel_file))
        verdict = {"verdict": "PASS", "failed_stage": None, "stages": [],
                   "timing": {"median_us": median_us(kernel_file) if callable(median_us) else median_us,
                              "iqr_us": 0.0, "reps": 20, "baseline_median_us": 100.0},
                   "device": {"type": "cpu"}}
        if judged_sha is not None:
            verdict["source_sha256"] = judged_sha(Path(kernel_file))
        return verdict
    return judge


def search(tmp_path, judge, max_experiments=1):
    run, state = tuned_run(tmp_path, judge, max_experiments)
    return run, state.targets[0]


def faster_after_baseline(kernel_file):
    return 50.0 if kernel_file.name == "exp_0000.py" else 10.0


def test_a_candidate_rewriting_the_records_while_judged_fails_and_everything_is_put_back(tmp_path):
    def tamper(kernel_file):
        if kernel_file.name != "exp_0001.py":
            return
        run_dir = kernel_file.parents[2]
        with open(run_dir / board.FILENAME, "a") as f:
            f.write("99\tforged\n")
        (run_dir / "best" / "softmax-8x128-float32.py").write_text(CHEAT)
        kernel_file.write_text(CHEAT)
        (run_dir / "best" / "extra.py").write_text(CHEAT)
        (run_dir / "best" / "__pycache__").mkdir()
        (run_dir / "best" / "__pycache__" / "softmax-8x128-float32.cpython-312.pyc").write_bytes(b"\0" * 16)
    run, target = search(tmp_path, judge_stub(faster_after_baseline, tamper))
    frame = board.read(run.leaderboard_path)
    assert list(frame["experiment"]) == [0, 1]
    assert list(frame["decision"]) == ["BASELINE", "REVERT"]
    assert (frame["verdict"][1], frame["failed_stage"][1]) == ("FAIL", "integrity")
    verdict = json.loads(run.experiment_file(target, 1, ".json").read_text())
    detail = next(s["detail"] for s in verdict["stages"] if s["name"] == "integrity")
    for name in ("leaderboard.tsv", "best/softmax-8x128-float32.py", "best/extra.py",
                 "kernels/softmax-8x128-float32/exp_0001.py", "best/__pycache__/softmax-8x128-float32.cpython-312.pyc"):
        assert name in detail
    assert verdict["timing"] is None
    assert CHEAT not in run.experiment_file(target, 1).read_text()  # put back as the search wrote it
    assert run.best_file(target).read_text() == run.experiment_file(target, 0).read_text()
    assert not (run.path / "best" / "extra.py").exists()
    assert not list((run.path / "best").rglob("*.pyc"))
    assert seal.check_run(run.path).ok


def test_a_verdict_for_other_text_than_the_search_held_fails(tmp_path):
    run, target = search(tmp_path, judge_stub(faster_after_baseline,
                                              judged_sha=lambda f: "0" * 64 if f.name == "exp_0001.py" else sha(f)))
    frame = board.read(run.leaderboard_path)
    assert list(frame["decision"]) == ["BASELINE", "REVERT"] and frame["failed_stage"][1] == "integrity"
    assert frame["decision"][0] == "BASELINE" and frame["verdict"][0] == "PASS"  # the judge's hash matched
    assert seal.check_run(run.path).ok


def test_best_is_written_from_the_held_text_not_from_the_file_on_disk(tmp_path, monkeypatch):
    # with the guard off, a file that changes on disk during judging must still not reach best/
    class NoGuard:
        def __init__(self, *args, **kwargs):
            pass

        def snapshot(self, held=None):
            return self

        def restore(self):
            return []
    monkeypatch.setattr(loop, "RecordGuard", NoGuard)
    held = {}

    def tamper(kernel_file):
        held[kernel_file.name] = kernel_file.read_text()
        kernel_file.write_text(CHEAT)
    run, target = search(tmp_path, judge_stub(faster_after_baseline, tamper))
    frame = board.read(run.leaderboard_path)
    assert list(frame["decision"]) == ["BASELINE", "KEEP"] and target.best_experiment == 1
    assert run.best_file(target).read_text() == held["exp_0001.py"] != CHEAT
    assert frame["source_sha256"][1] == hashlib.sha256(held["exp_0001.py"].encode()).hexdigest()
    errors = seal.check_run(run.path).errors  # the changed files on disk no longer match their rows
    assert any("exp_0001.py: its sha256" in e for e in errors)
    assert not any(e.startswith("best/") for e in errors)


# ------------------------------------------------------------------ the probe as a candidate, during a run
def forging(source, runs_dir, target):
    """`source` with the probe's three forgeries done at import, against every run under runs_dir."""
    row = board.make_row(experiment=99, target=target, kernel_type="softmax", agent="llm", decision="KEEP",
                         verdict={"verdict": "PASS", "timing": {"median_us": 0.5}}, candidate="", description="x")
    line = "\t".join(board.escape(row.get(c)) for c in board.COLUMNS) + "\n"
    return source + f'''
import pathlib as _pathlib
for _board in _pathlib.Path({str(runs_dir)!r}).glob("*/leaderboard.tsv"):
    with open(_board, "a") as _f:
        _f.write({line!r})
    for _best in _board.parent.glob("best/*.py"):
        _best.write_text({CHEAT!r})
    for _exp in _board.parent.glob("kernels/*/exp_0001.py"):
        _exp.write_text(_exp.read_text() + "\\n# rewritten\\n")
'''


def assert_probe_failed(run, slug, candidate):
    """The forging candidate failed with a named reason; no forged row; best/ is what was judged."""
    frame = board.read(run.leaderboard_path)
    assert list(frame["experiment"]) == [0, 1]
    assert frame["verdict"][1] != "PASS" and frame["decision"][1] == "REVERT" and frame["failed_stage"][1]
    verdict = json.loads((run.path / "kernels" / slug / "exp_0001.json").read_text())
    failed = [s["detail"] for s in verdict["stages"] if s["status"] == "fail"]
    assert failed and failed[-1]
    # the static check is off (the callers): the probe ran, and the layers behind the filter stopped it
    assert "static check refused" not in failed[-1], "the probe never ran"
    if verdict["failed_stage"] == "integrity":  # no sandbox stopped the writes: the search caught them
        assert "leaderboard.tsv" in failed[-1] and f"best/{slug}.py" in failed[-1]
    assert (run.path / "kernels" / slug / "exp_0001.py").read_text() == candidate
    assert (run.path / "best" / f"{slug}.py").read_text() == (run.path / "kernels" / slug / "exp_0000.py").read_text()
    assert not (run.path / "kernels" / slug / "exp_0099.py").exists()
    assert seal.check_run(run.path).ok


@pytest.mark.slow
def test_the_probe_as_an_llm_candidate_fails_and_leaves_the_records_sealed(tmp_path, fake_openai,  # noqa: F811
                                                                           monkeypatch):
    # the static check would refuse the probe's imports before it runs: off, so the sandbox is tested
    monkeypatch.setenv("AUTOKERNEL_STATIC_CHECK", "off")
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    model = tmp_path / "softmax_model.py"
    model.write_text(SOFTMAX_MODEL)
    runs_dir = tmp_path / "runs"
    candidate = forging(FAST, runs_dir, TARGET)
    fake_openai.script(reply(reply_with("Pack rows.", candidate)))
    options = run_start.OptimizeOptions(llm=MODEL, base_url=fake_openai.base_url, max_experiments=1, top=1,
                                   timeout_s=300)
    run, state, config = run_start.start(spec_from_options(model, device="cpu"), options, runs_dir)
    run_search.execute(run, state, config, client=LLMClient(MODEL, base_url=fake_openai.base_url))
    assert_probe_failed(run, SLUG, candidate)


@pytest.mark.slow
def test_the_probe_as_a_kernelbench_solution_fails_and_leaves_the_records_sealed(tmp_path, fake_openai,  # noqa: F811
                                                                                monkeypatch):
    from autokernel.kernelbench import run as kb_run
    # the static check would refuse the probe's imports before it runs: off, so the sandbox is tested
    monkeypatch.setenv("AUTOKERNEL_STATIC_CHECK", "off")
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    kb = tmp_path / "KernelBench" / "level1"
    kb.mkdir(parents=True)
    shutil.copy(KERNELBENCH / "level1" / "19_ReLU.py", kb)
    solution = (KERNELBENCH / "solutions" / "19_ReLU_correct.py").read_text()
    runs_dir = tmp_path / "runs"
    candidate = forging(solution, runs_dir, "19_ReLU")
    fake_openai.script(reply(f"ReLU.\n```python\n{solution}```\n"), reply(f"Again.\n```python\n{candidate}```\n"))
    options = kb_run.KBRunOptions(agent="llm", llm=MODEL, base_url=fake_openai.base_url, max_experiments=2,
                                  device="cpu", reps=3, warmup=1, timeout_s=60, compile_baseline=False)
    run, state, config = kb_run.start(tmp_path, 1, None, options, runs_dir)
    kb_run.execute(run, state, config)
    assert_probe_failed(run, "19_ReLU", candidate)
    summary = json.loads((run.path / "kernelbench.json").read_text())
    assert summary["problems"][0]["solution"] == "best/19_ReLU.py" and summary["problems"][0]["correct"] is True
