"""Attacks on the launch monitor and the compile for the target (tests/attacks/monitor_kernels.py),
judged with the static check switched off so that they reach the layers behind it, beside honest
kernels (one of them with two constexpr branches, both compiled for sm_90): each attack ends in FAIL
with its named reason, the honest kernels PASS. The kernel that keeps Triton's run at import is
also served from an exported package, in a user's plain process: its torch.softmax is refused
there too, never handed to the model."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import judge_kernels
import monitor_kernels
from autokernel.deploy.export import Exported, write_package
from fresh_process import NO_PROJECT_CODE
from harness.kernel_types.registry import Case
from judge_batch import judge_batch
from paths import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
TARGET = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)
HONEST = {"honest_softmax_rows": judge_kernels.GOOD / "softmax_rows.py",
          "starter_softmax": ROOT / "starter_kernels" / "triton" / "softmax.py"}

# name -> (the stage that fails it, a phrase its reason must hold)
EXPECTED = {
    # the run it kept is the one it is called through, judged as served: it serves torch.softmax
    # PyTorch compute, named as dispatched: aten::softmax in a call under torch.inference_mode (no
    # autograd to decompose it first), aten::_softmax in the others
    "keeps_run": ("integrity", "softmax; only allocation, views, copies and casts are allowed"),
    # smoke's call is its second: the branch only the interpreter accepts, compiled for sm_90
    "later_branch": ("smoke", "does not compile for sm_90"),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("monitor_attacks")
    paths = dict(HONEST)
    for name, text in monitor_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    return judge_batch(paths, TARGET, static_check=False)


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_monitor_attack_fails_with_its_named_reason(judged, name):
    v = judged[name]
    stage, phrase = EXPECTED[name]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", stage), _reason(v)[:2000]
    assert phrase in _reason(v), _reason(v)[:2000]


@pytest.mark.parametrize("name", sorted(HONEST))
def test_the_honest_kernels_pass_beside_them(judged, name):
    assert judged[name]["verdict"] == "PASS", _reason(judged[name])[:2000]


SERVE = NO_PROJECT_CODE + r'''
import json, torch
import autokernel_kernels as ak
out = {}
for w in ak.winners():
    x = torch.randn(4, 64)
    try:
        y = w.kernel_fn(x)
        out[w.target] = "served: " + str(torch.allclose(y, torch.softmax(x, -1), atol=1e-5))
    except BaseException as e:
        out[w.target] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
'''


@pytest.mark.parametrize("audit", ["on", "off"])
def test_served_the_kernel_that_keeps_run_gets_no_torch_compute(tmp_path, audit):
    """Exported as if it had won: served, it sees what it saw judged and takes the same branch,
    and the package's op recorder refuses the call (with or without the audit hook)."""
    sources = {"keeps_run": tmp_path / "keeps_run.py", "honest": tmp_path / "honest.py"}
    sources["keeps_run"].write_text(monitor_kernels.KEEPS_RUN)
    sources["honest"].write_text(judge_kernels.source())
    entries = [{"target": name, "kernel_type": "softmax", "backend": "triton", "dims": {"M": 4, "N": 64},
                "dtype": "float32", "kwargs": {}, "source": f"kernels/{name}.py", "route": "op", "modules": []}
               for name in sources]
    parent = tmp_path / "out"
    write_package(Exported(None, {"run_id": "r", "kernels": entries, "left_out": []}, sources),
                  parent / "autokernel_kernels")
    # the static check at load would refuse the file before import (its torch.softmax and .run):
    # switched off, so that the launch monitor and the op recorder are what this proves
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TRITON_INTERPRET": "1",
           "AUTOKERNEL_KERNEL_AUDIT": audit, "AUTOKERNEL_STATIC_CHECK": "off"}
    proc = subprocess.run([sys.executable, "-c", SERVE], cwd=parent, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["honest"] == "served: True"
    assert out["keeps_run"].startswith("KernelRefused: keeps_run: PyTorch compute inside a served kernel_fn: "
                                       "aten::_softmax"), out
