"""The exported package in a user's plain process: a winner that reaches an event the audit hook
refuses raises when served (never a quiet fallback), honest winners beside it serve, and
AUTOKERNEL_KERNEL_AUDIT=off leaves the hook out."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import judge_kernels
from autokernel.deploy.export import Exported, write_package
from fresh_process import NO_PROJECT_CODE
from paths import ROOT

sys.path.insert(0, str(ROOT / "tests" / "attacks"))
import cache_kernels  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PEP 578 hooks are tested on Linux")

SERVE = NO_PROJECT_CODE + r'''
import json, sys, torch
import autokernel_kernels as ak
out = {}
for w in ak.winners():
    x = torch.randn(4, 64)
    try:
        for _ in range(4):
            y = w.kernel_fn(x)
        out[w.target] = "served: " + str(torch.allclose(y, torch.softmax(x, -1), atol=1e-5))
    except BaseException as e:
        out[w.target] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
'''


def _entry(target: str, module: str) -> dict:
    return {"target": target, "kernel_type": "softmax", "backend": "triton", "dims": {"M": 4, "N": 64},
            "dtype": "float32", "kwargs": {}, "source": f"kernels/{module}.py", "route": "op", "modules": []}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """A package with an honest winner and one that walks a generator's frame from its third call
    (written here by hand: the judge's static check would refuse such a file, and so would the
    package's own check at load; _serve switches that off to reach the hook behind it)."""
    folder = tmp_path_factory.mktemp("served")
    honest, gadget = folder / "honest.py", folder / "gadget.py"
    honest.write_text(judge_kernels.source())
    gadget.write_text(cache_kernels.SERVED_GADGET)
    manifest = {"run_id": "r", "kernels": [_entry("honest", "honest"), _entry("gadget", "gadget")], "left_out": []}
    write_package(Exported(None, manifest, {"honest": honest, "gadget": gadget}), folder / "out" / "autokernel_kernels")
    return folder / "out"


def _serve(parent, **env) -> dict:
    import os
    full = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TRITON_INTERPRET": "1",
            "AUTOKERNEL_STATIC_CHECK": "off", **env}
    proc = subprocess.run([sys.executable, "-c", SERVE], cwd=parent, env=full, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_served_winner_reaching_a_refused_event_raises(package):
    out = _serve(package)
    assert out["honest"] == "served: True"
    assert out["gadget"].startswith("KernelRefused: gadget: refused by the judge's audit hook: frame introspection"), out


def test_the_guard_can_be_switched_off(package):
    out = _serve(package, AUTOKERNEL_KERNEL_AUDIT="off")
    assert out == {"honest": "served: True", "gadget": "served: True"}


GADGET_RMSNORM_TAIL = '''

_served = [0]
_honest = kernel_fn


def _peek():
    yield 1


def kernel_fn(x, weight, eps=1e-6):
    _served[0] += 1
    if _served[0] >= 3:  # past the first calls: a frame walk, caught and ignored
        try:
            getattr(_peek(), "gi_" + "frame")
        except Exception:
            pass
    return _honest(x, weight, eps)
'''


def test_verify_stops_at_a_winner_reaching_a_refused_event(tmp_path):
    from autokernel.search.run import RunDir
    from starter_kernels import starter_path
    from processes import user_env
    from tiny_llama import make_run, rewrite_winner
    run = make_run(tmp_path)
    rewrite_winner(RunDir(run), "rmsnorm[8x32:float32]", starter_path("rmsnorm").read_text() + GADGET_RMSNORM_TAIL)
    # the static check at load would refuse the gadget first: switched off to reach the hook
    proc = subprocess.run([sys.executable, "-m", "autokernel", "verify", str(run)], cwd=ROOT,
                          env={**user_env(), "AUTOKERNEL_STATIC_CHECK": "off"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rmsnorm[8x32:float32]: refused by the judge's audit hook: frame introspection" in proc.stderr, \
        proc.stderr[-3000:]
    assert not (run / "verify.json").exists()
