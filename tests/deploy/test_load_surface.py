"""What ships is checked again where it loads: verify and an exported package hold each winner's
file to the judge's static check (the closed surface) before importing it, and refuse one that
fails, naming its file, line and name. The honest starter loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autokernel.deploy import routing
from autokernel.deploy.export import Exported, write_package
from fresh_process import NO_PROJECT_CODE
from paths import ROOT

STARTER = ROOT / "starter_kernels" / "triton" / "softmax.py"
# the starter, plus a dormant native write to every fd on its 400th call: never judged as shipped
DORMANT = STARTER.read_text().replace(
    "\n\ndef kernel_fn(x):\n",
    "\n\nimport torch\n_calls = [0]\n\n\ndef kernel_fn(x):\n    _calls[0] += 1\n    if _calls[0] == 400:\n"
    "        for fd in range(3, 64):\n"
    "            torch.empty(8, dtype=torch.uint8)._typed_storage()._untyped_storage._write_file(fd, True, False, 1)\n", 1)
DORMANT_LINE = DORMANT.splitlines().index(
    "            torch.empty(8, dtype=torch.uint8)._typed_storage()._untyped_storage._write_file(fd, True, False, 1)") + 1


def test_verify_refuses_to_load_a_winner_that_fails_the_surface(tmp_path):
    path = tmp_path / "exp_0007.py"
    path.write_text(DORMANT)
    with pytest.raises(routing.SurfaceRefused) as refused:
        routing.load_kernel(path, "winner_exp_0007")
    assert f"exp_0007.py:{DORMANT_LINE}: private name: ._typed_storage" in str(refused.value)
    assert "winner_exp_0007" not in sys.modules  # never imported


def test_the_honest_starter_loads(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    module = routing.load_kernel(STARTER, "winner_softmax_starter")
    assert callable(module.kernel_fn)


# a fresh interpreter as if autokernel were not installed: `harness` only from the package's vendor/
USE = NO_PROJECT_CODE + r'''
import sys
sys.path.insert(0, sys.argv[1])
import autokernel_kernels as ak
try:
    ak.winners()
except ImportError as e:
    print(type(e).__name__, e)
else:
    print("loaded", len(ak.winners()))
'''


@pytest.mark.parametrize("text, want", [(DORMANT, f"kernels/softmax_dormant.py:{DORMANT_LINE}: private name"),
                                        (STARTER.read_text(), "loaded 1")], ids=["dormant", "honest"])
def test_an_exported_package_refuses_a_winner_that_fails_the_surface(tmp_path, text, want):
    source = tmp_path / "softmax_dormant.py"
    source.write_text(text)
    kernel = {"target": "softmax[4x64:float32]", "kernel_type": "softmax", "backend": "triton",
              "dims": {"M": 4, "N": 64}, "dtype": "float32", "kwargs": {}, "source": "kernels/softmax_dormant.py",
              "route": "op", "modules": [], "serving": None}
    package = tmp_path / "out" / "autokernel_kernels"
    package.mkdir(parents=True)
    write_package(Exported(run=None, manifest={"kernels": [kernel], "left_out": []},
                           sources={"softmax_dormant": source}), package)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": ""}  # the package's own vendor/, not this checkout
    done = subprocess.run([sys.executable, "-c", USE, str(package.parent)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert want in done.stdout, done.stdout + done.stderr[-3000:]
    assert (package / "vendor" / "harness" / "isolation" / "static_check.py").is_file()
