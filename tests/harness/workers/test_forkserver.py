"""The pre-imported judge worker: a candidate forked from the zygote gets the same stages and the same
verdict as one spawned as `python -m harness.workers.worker`, with its isolation (sandbox, own process group,
timeout, death with the judge) kept; a zygote that cannot serve falls back to spawning."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import judge_kernels
from harness.workers import forkserver
from harness.judge import judge
from harness.workers.judge_session import judge_session
from processes import children, judge_workers, killed_scratch, still_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks: Linux only")
NAMES = ["correct", "wrong_math", "segfault", "hang", "exits_early", "numpy_no_launch", "noisy_but_correct"]
# judged again spawned, one of each way a worker ends: a pass, a crash, a timeout, the static check's
# refusal (a spawned wrong_math is test_a_zygote_that_cannot_start_falls_back_to_spawning's, a
# spawned sandbox refusal tests/harness/isolation/test_sandbox.py's)
SPAWNED = ["correct", "segfault", "hang", "numpy_no_launch"]
RUN_FOLDER_WRITER = "torch.save(torch.zeros(1), {target!r})\n"


def _kernels(folder: Path) -> dict[str, Path]:
    paths = judge_kernels.write_variants(folder, NAMES)
    target = folder / "run" / "leaderboard.tsv"
    target.parent.mkdir()
    paths["sandbox_write"] = folder / "sandbox_write.py"
    paths["sandbox_write"].write_text(judge_kernels.source(prelude=RUN_FOLDER_WRITER.format(target=str(target))))
    return paths


def _judge_all(paths: dict[str, Path], forked: bool) -> dict[str, dict]:
    with ThreadPoolExecutor(2) as pool:  # two judges at once: two zygotes, one candidate each
        return dict(zip(paths, pool.map(
            lambda item: judge(item[1], device="cpu", timeout_s=judge_kernels.timeout_s(item[0], forked)),
            paths.items())))


@pytest.fixture(scope="module")
def both(tmp_path_factory, judged):
    """Forked: the session's verdicts (tests/conftest.py judges every variant in a judge session),
    and this file's own kernel; spawned: the same files judged with no session."""
    paths = _kernels(tmp_path_factory.mktemp("forked"))
    # sandbox_write reaches torch.save, which the static check refuses first: off, the sandbox must hold
    with pytest.MonkeyPatch.context() as mp, judge_session(fork=True) as session:
        mp.setenv("AUTOKERNEL_STATIC_CHECK", "off")
        forked = _judge_all({"sandbox_write": paths["sandbox_write"]}, forked=True)
        counts = (judged.forked + session.pool.forked, judged.fallbacks + session.pool.fallbacks,
                  judged.baseline_runs + session.baselines.runs)
    forked.update({name: judged.verdicts[name] for name in NAMES})
    with pytest.MonkeyPatch.context() as mp:  # outside a session judge() opens its own, forked: off here
        mp.setenv("AUTOKERNEL_JUDGE_FORK", "0")
        spawned = _judge_all({name: paths[name] for name in SPAWNED}, forked=False)
    return forked, spawned, counts


def _summary(v: dict) -> tuple:
    return v["verdict"], v["failed_stage"], [(s["name"], s["status"]) for s in v["stages"]]


@pytest.mark.parametrize("name", NAMES + ["sandbox_write"])
def test_forked_and_spawned_workers_give_the_same_verdict(both, name):
    forked, spawned, _ = both
    want = judge_kernels.VARIANTS[name][1:] if name in judge_kernels.VARIANTS else ("FAIL", "compile")
    assert (forked[name]["verdict"], forked[name]["failed_stage"]) == want
    if name != "numpy_no_launch":  # refused by the static check: no worker at all
        assert forked[name]["judge_seconds"]["worker"] == "fork"
    if name not in spawned:
        return
    assert _summary(forked[name]) == _summary(spawned[name])
    if name != "numpy_no_launch":
        assert spawned[name]["judge_seconds"]["worker"] == "spawn"
        # the hang's deadline is a few seconds: on a busy machine a spawned worker can be killed
        # before it has confined itself, which is the deadline's doing, not the sandbox's
        if name != "hang" or spawned[name]["sandbox"]["kind"] != "none":
            assert forked[name]["sandbox"]["kind"] == spawned[name]["sandbox"]["kind"]


def test_the_sandbox_still_refuses_writes_in_a_forked_child(both):
    forked, _, _ = both
    v = forked["sandbox_write"]
    if v["sandbox"]["kind"] != "landlock":
        pytest.skip("no Landlock on this kernel")
    detail = next(s["detail"] for s in v["stages"] if s["name"] == "compile")
    assert "refused by the judge's OS sandbox" in detail


def test_every_worker_came_from_the_zygote(both, judged):
    forked_count, fallbacks, baseline_runs = both[2]
    # every file of the session's batch but the static check's refusals, and sandbox_write, and the
    # clean baseline workers (once per target: fewer than the candidates that reached a worker)
    reached_a_worker = [v for v in judged.verdicts.values() if v.get("judge_seconds", {}).get("worker")]
    assert 0 < baseline_runs < len(reached_a_worker)
    assert fallbacks == 0 and forked_count == len(reached_a_worker) + 1 + baseline_runs


def test_zygote_is_single_threaded_never_touches_cuda_and_a_timeout_leaves_no_child(tmp_path):
    from harness.judge import child_env
    paths = judge_kernels.write_variants(tmp_path, ["hang"])
    zygote = forkserver.Zygote(child_env("cpu"))
    try:
        zygote.start()
        assert len(os.listdir(f"/proc/{zygote.proc.pid}/task")) == 1  # fork from one thread only
        out, cwd = tmp_path / "out", tmp_path / "cwd"
        out.mkdir(), cwd.mkdir()
        # killed at its deadline wherever it is by then (starting, or hanging): 2 s is enough for either
        result = zygote.run([str(paths["hang"]), str(out), "--device", "cpu", "--no-sandbox"], 2.0,
                            {**child_env("cpu"), "TMPDIR": str(tmp_path)}, cwd)
        assert result.timed_out and result.returncode == -signal.SIGKILL
        assert children(zygote.proc.pid) == []
        assert zygote.alive()
        # a child that exits at once: its two replies may come in one read, and neither is lost
        quick = zygote.run(["--no-such-option"], 120.0, {**child_env("cpu"), "TMPDIR": str(tmp_path)}, cwd)
        assert (quick.timed_out, quick.returncode) == (False, 2) and "usage:" in quick.stderr
    finally:
        zygote.close()
    assert not zygote.alive()


def test_the_first_zygote_computes_tritons_key_and_later_ones_are_handed_it(monkeypatch):
    from triton.runtime.cache import triton_key

    from harness.judge import child_env

    def started() -> str | None:
        zygote = forkserver.Zygote(child_env("cpu"))
        try:
            zygote.start()
        finally:
            zygote.close()
        return forkserver._triton_key

    monkeypatch.setattr(forkserver, "_triton_key", None)
    assert started() == triton_key()  # the first one hashed Triton's library, as this process does
    # a later one is handed the key and uses it rather than hashing again: a planted key comes back
    monkeypatch.setattr(forkserver, "_triton_key", "planted")
    assert started() == "planted"


def test_a_zygote_that_cannot_start_falls_back_to_spawning(tmp_path, monkeypatch):
    monkeypatch.setattr(forkserver, "ZYGOTE_ARGV", ["-c", "import sys; sys.exit(3)"])
    paths = judge_kernels.write_variants(tmp_path, ["wrong_math"])
    with judge_session(fork=True) as session:
        v = judge(paths["wrong_math"], device="cpu", timeout_s=180)
        # the clean baseline worker's and the candidate's: each falls back on its own
        assert session.pool.fallbacks == 2 and session.pool.forked == 0
    assert (v["verdict"], v["failed_stage"], v["judge_seconds"]["worker"]) == ("FAIL", "smoke", "spawn")


def test_a_later_session_forks_from_the_zygote_an_earlier_one_left(tmp_path, monkeypatch):
    """judge() outside a session opens one of its own; the next call's workers fork from the zygote
    the last call left, where the environment is the same, and the verdicts agree."""
    paths = judge_kernels.write_variants(tmp_path, ["wrong_math"])
    forkserver.close_kept()
    started: list[int] = []
    real = forkserver.Zygote.__init__

    def counted(self, env):
        real(self, env)
        started.append(self.proc.pid)

    monkeypatch.setattr(forkserver.Zygote, "__init__", counted)
    first = judge(paths["wrong_math"], device="cpu", timeout_s=180)
    kept = [z.proc.pid for _, z in forkserver._kept]
    assert started and kept == started  # the baseline's worker and the candidate's, one after the other
    second = judge(paths["wrong_math"], device="cpu", timeout_s=180)
    assert started == kept and [z.proc.pid for _, z in forkserver._kept] == kept  # no zygote started
    assert second["judge_seconds"]["worker"] == "fork" and _summary(second) == _summary(first)
    # what torch writes into the environment once it has compiled, and the switches read when a
    # judgement runs: each child takes them after the fork, from the same zygote
    for name, value in (("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor")), ("AUTOKERNEL_STATIC_CHECK", "off"),
                        ("AUTOKERNEL_CACHE_DIR", str(tmp_path / "cache"))):
        monkeypatch.setenv(name, value)
    third = judge(paths["wrong_math"], device="cpu", timeout_s=180)
    assert started == kept and _summary(third) == _summary(first)
    monkeypatch.setenv("AUTOKERNEL_TEST_OTHER_ENV", "1")  # another environment: another zygote
    judge(paths["wrong_math"], device="cpu", timeout_s=180)
    assert len(started) == 2 and len(forkserver._kept) == 2
    forkserver.close_kept()
    assert not forkserver._kept and still_alive(started, timeout_s=15) == []  # closed, not left running


def test_opt_out_spawns(monkeypatch):
    monkeypatch.setenv("AUTOKERNEL_JUDGE_FORK", "0")
    with judge_session() as session:
        assert session.pool is None
    monkeypatch.setenv("AUTOKERNEL_JUDGE_FORK", "1")
    with judge_session() as session:
        assert session.pool is not None


def test_forked_worker_dies_with_a_killed_judge(tmp_path):
    """kill -9 of the judging process: the zygote sees its pipe close and kills its child's group."""
    kernel = tmp_path / "hangs.py"
    kernel.write_text("KERNEL_TYPE = 'softmax'\nBACKEND = 'triton'\ndef kernel_fn(x):\n    while True:\n        pass\n")
    code = ("import sys\nfrom harness.judge import judge\nfrom harness.workers.judge_session import judge_session\n"
            "with judge_session(fork=True):\n    judge(sys.argv[1], device='cpu', timeout_s=600)\n")
    scratch = Path(killed_scratch(tmp_path))
    parent = subprocess.Popen([sys.executable, "-c", code, str(kernel)], env={**os.environ, "TMPDIR": str(scratch)})
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not workers:
            time.sleep(0.5)
            zygotes = children(parent.pid)
            forked = [c for z in zygotes for c in children(z)]
            # listed as a worker, by the file it judges, as a spawned one is: a forked child takes
            # that title a moment after the fork, until then it carries the zygote's
            titled = {pid for z in zygotes for pid in judge_workers("/hangs.py", parent=z)}
            workers = forked if forked and set(forked) <= titled else []
        assert workers, "no forked worker named itself as the worker judging hangs.py"
    finally:
        parent.kill()
        parent.wait()
    assert not still_alive(workers, timeout_s=15)
    # and the zygote, told by the closed pipe, removed the folder the judge made for it
    deadline = time.time() + 15
    while list(scratch.glob("ak-zygote-*")) and time.time() < deadline:
        time.sleep(0.2)
    assert not list(scratch.glob("ak-zygote-*"))


@pytest.mark.gpu
def test_a_forked_worker_initialises_cuda_itself_and_judges_a_starter(tmp_path):
    """CUDA does not survive fork: the zygote never touches it, each child initialises it."""
    from harness.kernel_types.registry import Case
    from starter_kernels import starter_path
    case = Case.make("softmax", {"M": 256, "N": 1024}, "float16", seed=7)
    with judge_session(fork=True) as session:
        first = judge(starter_path("softmax", "triton"), target=case, device="cuda", compile_baseline=True)
        second = judge(starter_path("softmax", "triton"), target=case, device="cuda", compile_baseline=True)
        assert session.pool.forked == 3 and session.pool.fallbacks == 0  # the clean baseline worker, once
    spawned = judge(starter_path("softmax", "triton"), target=case, device="cuda")
    assert first["verdict"] == second["verdict"] == spawned["verdict"] == "PASS"
    assert second["judge_seconds"]["worker"] == "fork" and second["timing"].get("compile_cached") is True
