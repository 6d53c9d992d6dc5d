"""The attack suite: correct kernels that lie (tests/attacks/attack_kernels.py), judged once per
session as `autokernel optimize` judges (a judge session, forked workers, two at a time), after two
honest kernels judged with a busy loop on the other core. Each attack must end in FAIL with
a named reason, the honest kernels in a PASS the judge's own clock confirmed; nothing may arrive at
a listener, and nothing read where a candidate may not read may appear in any verdict."""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

import attack_kernels
import judge_kernels
from judge_batch import judge_batch
from harness.judge import judge
from harness.kernel_types.registry import Case
from harness.isolation.sandbox import abi_version

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
# a tiny timed case: the attacks act on every call, and the interpreter is slow
TARGET = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)
HONEST = ("honest_correct", "honest_softmax_rows")
SECRET = "ak-secret-9f2c41 the key that pays for the LLM"
BOARD = "experiment\tdecision\tmedian_us\n7\tKEEP\t123.456789\n"
BEST = "# the other run's best kernel\n"

# name -> (the stage that fails it, a phrase its reason must hold)
EXPECTED = {
    "traceback_shrinks_samples": ("integrity", "frame introspection (tb_frame)"),
    "logging_currentframe": ("integrity", "frame introspection (sys._getframe)"),
    "generator_frame": ("integrity", "frame introspection (gi_frame)"),
    "self_restoring_clock": ("integrity", "time.perf_counter was replaced by the candidate (seen right after"),
    # the loop itself reads the swapped clock first, which puts it back: only the witness can tell
    "clock_via_other_module": ("integrity", "disagrees with the judge's own clock"),
    "summary_rewritten": ("integrity", "the worker's timing record differs from the reps it reported"),
    "lies_only_around_the_target": ("integrity", "at softmax[16x256:float32]: the time measured inside the worker "
                                                 "disagrees with the judge's own clock"),
    "pickle_socket": ("integrity", "pickle.find_class('socket', 'socket')"),
    "pickle_marshal": ("integrity", "pickle.find_class('marshal', 'loads')"),
    "reduce_import": ("integrity", "pickle.find_class('_pickle', 'loads')"),
    "udp_exfiltration": ("integrity", "refused by the judge's audit hook"),
    "unix_socket_exfiltration": ("integrity", "socket.__new__"),
    "error_text_exfiltration": ("compile", "Permission denied"),
    "reads_another_run": ("integrity", "open("),
    "forges_witness_lines": ("integrity", "the witness socket carried what the timing loop does not send"),
}


class Listeners:
    """A UDP socket and a pathname unix socket on this machine, listening for the attacks."""

    def __init__(self, folder: Path):
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = folder / "exfil.sock"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(str(self.unix_path))
        self.unix.listen(4)
        for s in (self.udp, self.unix):
            s.setblocking(False)

    def received(self) -> list:
        got = []
        for receive in (lambda: self.udp.recvfrom(65536), lambda: self.unix.accept()):
            try:
                got.append(receive())
            except (BlockingIOError, OSError):
                pass
        return got

    def close(self) -> None:
        self.udp.close()
        self.unix.close()


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """Every attack and the honest kernels, judged once: the honest ones with the other core kept busy."""
    folder = tmp_path_factory.mktemp("attacks")
    home = folder / "home"
    home.mkdir()
    (home / "secret.txt").write_text(SECRET)
    other = folder / "runs" / "other_run"
    (other / "best").mkdir(parents=True)
    (other / "leaderboard.tsv").write_text(BOARD)
    (other / "best" / "softmax.py").write_text(BEST)
    listeners = Listeners(folder)
    bait = attack_kernels.Bait(home / "secret.txt", SECRET, other, listeners.udp.getsockname()[1],
                               listeners.unix_path)
    paths = {}
    for name, text in attack_kernels.sources(bait).items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    paths["honest_correct"] = folder / "honest_correct.py"
    paths["honest_correct"].write_text(judge_kernels.source())
    paths["honest_softmax_rows"] = judge_kernels.GOOD / "softmax_rows.py"
    # the static check refuses most of these before import (tests/attacks/test_caches_and_shipping.py):
    # switched off here, they reach the layers behind it, which must hold on their own; the honest
    # kernels with the other core kept busy: the witness must not fail them there
    verdicts = judge_batch(paths, TARGET, busy_for=HONEST, static_check=False, time_around=True)
    received = listeners.received()
    listeners.close()
    return verdicts, received, other


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_attack_fails_with_its_named_reason(attacked, name):
    v = attacked[0][name]
    stage, phrase = EXPECTED[name]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", stage), _reason(v)[:2000]
    assert phrase in _reason(v), _reason(v)[:2000]


def test_the_honest_kernels_pass_beside_the_attacks_on_a_loaded_machine(attacked):
    for name in HONEST:
        v = attacked[0][name]
        assert v["verdict"] == "PASS", _reason(v)[:2000]
        assert v["timing"]["witness"]["agrees"], v["timing"]["witness"]
        assert v["timing"]["witness"]["null_reps"] > 0


def test_nothing_arrives_at_any_listener(attacked):
    assert attacked[1] == []


def test_nothing_read_where_candidates_may_not_read_reaches_a_verdict(attacked):
    verdicts, _, other = attacked
    text = json.dumps(verdicts)
    assert SECRET not in text
    assert "123.456789" not in text
    assert (other / "best" / "softmax.py").read_text() == BEST
    assert (other / "leaderboard.tsv").read_text() == BOARD


@pytest.mark.skipif(abi_version() < 4, reason="needs Landlock ABI 4 or later")
def test_the_verdicts_state_every_layer_and_no_read_reaches_home_or_runs(attacked):
    verdicts, _, other = attacked
    sandbox = verdicts["honest_correct"]["sandbox"]
    assert sandbox["kind"] == "landlock" and sandbox["network"] == "denied"
    assert sandbox["layers"]["socket_filter"].startswith("socket(2)")
    assert sandbox["layers"]["namespace"].startswith("fresh user and network namespace")

    def beneath(path: Path, root: str) -> bool:
        return str(path) == root or str(path).startswith(root.rstrip("/") + "/")
    for place in (other, Path.home(), Path.home() / ".ssh", Path("/tmp")):
        assert not any(beneath(place, root) for root in sandbox["reads"]), (place, sandbox["reads"])


@pytest.mark.gpu
def test_a_cuda_event_patched_for_one_call_fails_integrity_naming_it(tmp_path):
    path = tmp_path / "cuda_event_patch.py"
    path.write_text(attack_kernels.cuda_event_source())
    v = judge(path, device="cuda", timeout_s=300)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity"), _reason(v)
    assert "torch.cuda.Event.elapsed_time was replaced by the candidate (seen right after" in _reason(v)


@pytest.mark.gpu
def test_an_honest_starter_passes_on_a_gpu_with_the_judges_clock_agreeing():
    from starter_kernels import starter_path
    case = Case.make("softmax", {"M": 4096, "N": 4096}, "float16", seed=7)
    v = judge(starter_path("softmax", "triton"), target=case, device="cuda", timeout_s=300)
    assert v["verdict"] == "PASS", _reason(v)
    witness = v["timing"]["witness"]
    assert witness["agrees"] and witness["null_reps"] == 100, witness
    assert v["sandbox"]["network"] == "denied" and v["sandbox"]["layers"]["socket_filter"].startswith("socket(2)")
