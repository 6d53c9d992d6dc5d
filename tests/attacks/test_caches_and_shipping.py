"""What outlives a judgement: a candidate that PASSes and rewrites the compiler cache cannot change
the verdict of an identical victim judged after it (each judgement compiles into caches of its
own), and a winner carrying dormant code is refused before anything imports it."""
from __future__ import annotations

import json
import os
import sys

import pytest

import cache_kernels
import judge_kernels
from harness.judge import judge
from harness.workers.judge_session import judge_session
from harness.kernel_types.registry import Case

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")
TARGET = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The victim judged, then the poisoner (its static check off: it attacks the layer behind the
    filter), then the victim again, in one judge session as `optimize` judges."""
    folder = tmp_path_factory.mktemp("cache_attack")
    victim, attacker = folder / "victim.py", folder / "poisoner.py"
    victim.write_text(judge_kernels.source())
    attacker.write_text(cache_kernels.CACHE_POISONER)
    with judge_session():
        before = judge(victim, target=TARGET, device="cpu", timeout_s=300)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AUTOKERNEL_STATIC_CHECK", "off")
            attack = judge(attacker, target=TARGET, device="cpu", timeout_s=300)
        after = judge(victim, target=TARGET, device="cpu", timeout_s=300)
    return before, attack, after


def test_a_poisoned_cache_entry_never_reaches_a_later_judgement(poisoned):
    before, attack, after = poisoned
    assert before["verdict"] == "PASS", json.dumps(before["stages"])[:2000]
    assert attack["verdict"] == "PASS"  # it gains nothing, and its own verdict shows nothing amiss
    assert after["verdict"] == "PASS", json.dumps(after["stages"])[:2000]
    shared = [k["shared_bytes"] for k in after["resources"]["kernels"]]
    assert shared == [k["shared_bytes"] for k in before["resources"]["kernels"]] and max(shared) < 300000


def test_no_shared_cache_is_writable(poisoned):
    """Every folder the sandbox let a candidate write lies beneath its own judgement's scratch."""
    before, attack, _ = poisoned
    for verdict in (before, attack):
        if verdict["sandbox"].get("kind") != "landlock":
            pytest.skip("no Landlock here: " + str(verdict["sandbox"].get("reason")))
        writes = [w for w in verdict["sandbox"]["writes"] if not w.startswith("/dev")]
        assert writes and all("ak-judge-" in w for w in writes), writes
        assert not any(w.startswith(os.path.expanduser("~/.triton")) for w in writes)


def test_a_dormant_gadget_is_refused_before_import(tmp_path):
    """Correct on every call a judgement makes; unpickles a payload on its 3,000th."""
    path = tmp_path / "gadget.py"
    path.write_text(cache_kernels.DORMANT_GADGET)
    v = judge(path, target=TARGET, device="cpu", timeout_s=300)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile")
    detail = next(s["detail"] for s in v["stages"] if s["name"] == "compile")
    assert "refused the file before import" in detail and "torch.serialization" in detail


def test_the_filter_refuses_the_suites_attacks_first(tmp_path):
    """The attacks of tests/attacks/attack_kernels.py are judged with the static check off, to test
    the layers behind it; with it on, the allow-list refuses every one of them before import."""
    import attack_kernels
    from harness.isolation.static_check import check_source
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "leaderboard.tsv").write_text("x\n")
    bait = attack_kernels.Bait(tmp_path / "secret", "s", tmp_path / "run", 9, tmp_path / "sock")
    passed = [name for name, text in attack_kernels.sources(bait).items() if not check_source(text)]
    assert passed == [], passed
