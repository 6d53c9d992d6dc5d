"""Attacks on the judge from inside a candidate's process, each refused with a named reason: a faked
clock (seen by the static check, and reached at run time where only the identity check sees it),
a replaced torch.cuda.Event, writes into the run folder, a TCP connection, a KernelBench solution
writing into the run folder, and a time faster than the hardware allows."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

import judge_kernels
from harness.judge import judge
from harness.isolation.sandbox import abi_version
from paths import KERNELBENCH


@pytest.fixture
def behind_the_filter(monkeypatch):
    """The static check off: these files reach what its allow-list refuses, to test the layers behind it."""
    monkeypatch.setenv("AUTOKERNEL_STATIC_CHECK", "off")

LANDLOCK = pytest.mark.skipif(abi_version() < 4, reason="needs Landlock ABI 4 or later (file and TCP rules)")
# a clock that hides 99% of the time: the probe that got a 100x faster PASS before these checks
FAKE_CLOCK = '''
_real = {clock}.perf_counter
def _fake():
    return _real() / 100
'''


def _failed_detail(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


def _kernel(tmp_path: Path, name: str, **parts) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(judge_kernels.source(**parts))
    return path


def test_clock_patch_seen_by_the_static_check_fails_compile_before_import(tmp_path):
    prelude = FAKE_CLOCK.format(clock="triton.runtime.autotuner.time") + \
        "triton.runtime.autotuner.time.perf_counter = _fake\n"
    path = _kernel(tmp_path, "clock_visible", prelude=prelude)
    line = path.read_text().splitlines().index("triton.runtime.autotuner.time.perf_counter = _fake") + 1
    v = judge(path, device="cpu", timeout_s=120)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile")
    assert f"clock_visible.py:{line}: assignment to a module attribute: triton.runtime.autotuner.time.perf_counter" \
        in _failed_detail(v)
    assert v["sandbox"]["kind"] == "none" and "no worker" in v["sandbox"]["reason"]  # refused before a worker


def test_clock_patch_reached_at_run_time_fails_integrity_naming_the_clock(behind_the_filter, tmp_path):
    # an attribute chain through an allowed module, stored through a list: no rule of the static
    # check sees it, so the worker's identity check must
    prelude = "_clocks = [triton.runtime.autotuner.time]\n" + FAKE_CLOCK.format(clock="_clocks[0]") + \
        "_clocks[0].perf_counter = _fake\n"
    v = judge(_kernel(tmp_path, "clock_runtime", prelude=prelude), device="cpu", timeout_s=120)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity")
    assert "time.perf_counter was replaced by the candidate (seen after import)" in _failed_detail(v)
    assert v["timing"] is None


def test_a_replaced_cuda_event_fails_integrity_even_without_a_gpu(behind_the_filter, tmp_path):
    # a store through a list alias: the static check's attribute-store rule refuses it before import
    # (tests/harness/isolation/test_static_check.py); behind it, the identity check must see it
    prelude = "_mods = [torch.cuda]\nclass _FakeEvent:\n    pass\n_mods[0].Event = _FakeEvent\n"
    v = judge(_kernel(tmp_path, "event_patch", prelude=prelude), device="cpu", timeout_s=120)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity")
    detail = _failed_detail(v)
    assert detail.startswith("torch.cuda.Event, ") and "were replaced by the candidate" in detail


@pytest.mark.gpu
def test_a_cuda_event_whose_elapsed_time_lies_fails_integrity_on_the_gpu(tmp_path):
    prelude = ("_mods = [torch.cuda]\n_Real = _mods[0].Event\n"
               "class _FastEvent(_Real):\n    def elapsed_time(self, end):\n"
               "        return super().elapsed_time(end) / 100\n_mods[0].Event = _FastEvent\n")
    v = judge(_kernel(tmp_path, "event_gpu", prelude=prelude), device="cuda", timeout_s=180)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity")
    detail = _failed_detail(v)
    assert detail.startswith("torch.cuda.Event, ") and "were replaced by the candidate" in detail
    assert v["sandbox"]["kind"] == "landlock"


def _run_folder(tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    board = run / "leaderboard.tsv"
    board.write_text("experiment\tdecision\n1\tBASELINE\n")
    return run, board


def _writer_prelude(run: Path) -> str:
    # torch.save passes the static check: only the sandbox stands between it and the run's records
    return (f"torch.save(torch.zeros(1), {str(run / 'leaderboard.tsv')!r})\n"
            f"torch.save(torch.zeros(1), {str(run / 'best' / 'softmax.py')!r})\n")


@LANDLOCK
def test_candidate_writing_into_the_run_folder_fails_and_writes_nothing(behind_the_filter, tmp_path):
    run, board = _run_folder(tmp_path)
    before = board.read_bytes()
    v = judge(_kernel(tmp_path, "forger", prelude=_writer_prelude(run)), device="cpu", timeout_s=120)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile")
    assert "refused by the judge's OS sandbox" in _failed_detail(v) and "Permission denied" in _failed_detail(v)
    assert board.read_bytes() == before and not (run / "best" / "softmax.py").exists()
    assert v["sandbox"]["kind"] == "landlock" and v["sandbox"]["network"] == "denied"
    assert not any(str(run).startswith(w) for w in v["sandbox"]["writes"] if not w.startswith("/dev"))


@LANDLOCK
def test_without_the_sandbox_the_same_write_lands(behind_the_filter, tmp_path, capfd):
    """The other direction: the attack is real, and only the sandbox stops it. (Wrong math, so the
    unsandboxed candidate is rejected quickly after its write.)"""
    run, board = _run_folder(tmp_path)
    body = judge_kernels.VARIANTS["wrong_math"][0]
    path = tmp_path / "forger_unsandboxed.py"
    path.write_text(body.replace('BACKEND = "triton"\n', 'BACKEND = "triton"\n' + _writer_prelude(run), 1))
    v = judge(path, device="cpu", timeout_s=120, sandbox=False)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "smoke")
    assert board.read_bytes() != b"experiment\tdecision\n1\tBASELINE\n"
    assert (v["sandbox"]["kind"], v["sandbox"]["reason"]) == ("none", "switched off on request (--no-sandbox)")
    assert "WITHOUT an OS sandbox" in capfd.readouterr().err


@LANDLOCK
def test_candidate_opening_a_socket_to_localhost_fails_and_connects_nowhere(behind_the_filter, tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        prelude = f"torch.multiprocessing.reducer.socket.create_connection(('127.0.0.1', {port}), timeout=5)\n"
        v = judge(_kernel(tmp_path, "caller", prelude=prelude), device="cpu", timeout_s=120)
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever connected
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile")
    assert "refused by the judge's" in _failed_detail(v)  # the audit hook or, behind it, the OS sandbox


@LANDLOCK
def test_kernelbench_solution_writing_into_the_run_folder_fails(behind_the_filter, tmp_path):
    from autokernel.judging.kb_evaluate import EvalOptions, evaluate
    kb = KERNELBENCH
    run, board = _run_folder(tmp_path)
    before = board.read_bytes()
    solution = tmp_path / "19_ReLU_forger.py"
    text = (kb / "solutions" / "19_ReLU_correct.py").read_text()
    solution.write_text(text.replace("\n\n@triton.jit", "\n\n" + _writer_prelude(run) + "\n\n@triton.jit", 1))
    opts = EvalOptions(device="cpu", reps=2, warmup=1, timeout_s=120, compile_baseline=False)
    v = evaluate(kb / "level1" / "19_ReLU.py", solution, opts)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "load")
    assert "refused by the judge's OS sandbox" in v["reason"]
    assert board.read_bytes() == before and not (run / "best" / "softmax.py").exists()
    assert v["sandbox"]["kind"] == "landlock"
    assert len(v["source_sha256"]) == 64


def test_verdict_names_the_hash_of_the_text_judged(tmp_path):
    import hashlib
    path = tmp_path / "refused.py"
    path.write_text(judge_kernels.source(prelude="import numpy"))
    v = judge(path, device="cpu", timeout_s=60)
    assert v["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile")


def test_landlock_is_reported_as_available_here():
    # this machine's kernel has Landlock; a container that filters it out shows up here, loudly
    assert abi_version() >= 1, "Landlock is missing: every verdict will say sandbox kind none"


def test_torch_is_untouched_by_the_tests():
    assert torch.cuda.Event.__module__.startswith("torch")


@LANDLOCK
def test_verify_runs_winners_confined_and_only_the_parent_writes_the_run(tmp_path, monkeypatch):
    # verify's own static check at load would refuse the winner first: off, to reach the sandbox
    monkeypatch.setenv("AUTOKERNEL_STATIC_CHECK", "off")
    from autokernel.search.run import RunDir
    from autokernel.deploy.verify_child import verify_confined
    from tiny_llama import make_run, rewrite_winner
    run = make_run(tmp_path)
    board = run / "leaderboard.tsv"
    winner = run / "best" / "rmsnorm-8x32-float32.py"
    # a winner that, once imported by verify, overwrites the run's leaderboard and its own file; its
    # records are consistent (it was judged at its target), so only the sandbox stands in its way
    attack = (f"\ntorch.save(torch.zeros(1), {str(board)!r})\n"
              f"torch.save(torch.zeros(1), {str(winner)!r})\n")
    text = winner.read_text()
    rewrite_winner(RunDir(run), "rmsnorm[8x32:float32]",
                   text.replace("\nKERNEL_TYPE", "\nimport torch" + attack + "\nKERNEL_TYPE", 1))
    before, original_winner = board.read_bytes(), winner.read_bytes()
    result = verify_confined(run, device="cpu")
    assert result["status"] == "failed"
    assert board.read_bytes() == before and winner.read_bytes() == original_winner
    result = json.loads((run / "verify.json").read_text())  # written by the parent, from the child's copy
    assert result["sandbox"]["kind"] == "landlock"
    # its compiler caches are its own: nothing a candidate wrote is loaded, nothing it builds is kept
    assert all("ak-verify-" in w for w in result["sandbox"]["writes"] if not w.startswith("/dev"))
    assert "rmsnorm[8x32:float32]" in result["guilty"]
    assert "Permission denied" in result["per_kernel"]["rmsnorm[8x32:float32]"]["guilty_reason"]


def test_host_support_states_what_children_get(tmp_path):
    # what a run's config.json promises, held to what a judged child reports it got: a kernel with a
    # wrong answer fails smoke inside the worker, cheaply, and its verdict states the child's sandbox
    from harness.isolation.sandbox import host_support
    support = host_support()
    v = judge(_kernel(tmp_path, "wrong", body="    y = x"), device="cpu", timeout_s=120)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "smoke"), v["stages"]
    got = v["sandbox"]
    assert (support["kind"], support.get("abi")) == (got["kind"], got.get("abi")), (support, got)
    if got["kind"] == "landlock":  # the network the child says is closed is the one promised
        assert got["network"] == "denied" and support["network"].startswith("denied")


class _Stopped(Exception):
    """Raised where the judge would start its worker: what it was handed has been read."""


def _worker_environments(tmp_path: Path, monkeypatch, judgements: int) -> list[tuple[dict, Path]]:
    """(the environment, the judgement's scratch folder) the judge hands each worker it starts."""
    from harness.workers import judge_session
    handed = []

    def start(argv, timeout_s, env, cwd, out_dir, restart=None):
        handed.append((dict(env), Path(out_dir).parent))
        raise _Stopped

    monkeypatch.setattr(judge_session, "run_worker", start)
    for _ in range(judgements):
        with pytest.raises(_Stopped):
            judge(_kernel(tmp_path, "correct"), device="cpu", timeout_s=120)
    return handed


def test_each_judgement_compiles_into_caches_of_its_own(tmp_path, monkeypatch):
    """Triton's cache, the CUDA build cache and torch's extension cache lie beneath the judgement's
    scratch; the torch.compile baseline's cache (written before any candidate runs) stays shared."""
    from harness.timing import compile_cache
    from harness import cuda_build
    from harness.isolation import sandbox
    from harness.judge import sandbox_argv
    # what the judge really hands its workers: each judgement's caches beneath its own scratch
    handed = _worker_environments(tmp_path, monkeypatch, judgements=2)
    for worker_env, scratch in handed:
        assert {n: Path(worker_env.get(n, "/")).is_relative_to(scratch) for n in sandbox.CACHE_VARIABLES} \
            == dict.fromkeys(sandbox.CACHE_VARIABLES, True), {n: worker_env.get(n) for n in sandbox.CACHE_VARIABLES}
    assert handed[0][1] != handed[1][1]  # two judgements, two scratch folders: no cache shared
    env = sandbox.private_caches(tmp_path)
    assert set(env) == set(sandbox.CACHE_VARIABLES) == {"TRITON_CACHE_DIR", "AUTOKERNEL_BUILD_CACHE", "TORCH_EXTENSIONS_DIR"}
    assert all(Path(p).is_dir() and Path(p).is_relative_to(tmp_path) for p in env.values())
    shared = compile_cache.root()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cuda_build.cache_root() == Path(env["AUTOKERNEL_BUILD_CACHE"])
    assert {str(p) for p in sandbox.caches_for_worker(extensions=True)} == set(env.values())
    assert compile_cache.root() == shared and not shared.is_relative_to(tmp_path)
    assert sandbox_argv(tmp_path, extensions=True) == ["--sandbox-write", str(tmp_path)]
