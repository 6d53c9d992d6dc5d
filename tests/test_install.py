"""A non-editable install works on its own: the starters, the playbook and the judge's worker are
found inside the installed package, not in this checkout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT



@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(ROOT)], check=True, cwd=tmp_path_factory.mktemp("cwd"))
    return target


def _run(code: str, target: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_package_data_resolves_inside_the_install(installed, tmp_path):
    code = ("import json, starter_kernels, playbook, harness, autokernel\n"
            "from starter_kernels import starter_path\n"
            "print(json.dumps({'starter': str(starter_path('softmax')), 'cuda': str(starter_path('matmul', 'cuda')),\n"
            "  'rules': len(playbook.read('rules')), 'harness': harness.__file__, 'autokernel': autokernel.__file__}))")
    out = _run(code, installed, tmp_path)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    for key in ("starter", "cuda", "harness", "autokernel"):
        assert found[key].startswith(str(installed)), (key, found[key])
    assert found["rules"] > 200


def test_installed_judge_passes_an_installed_starter(installed, tmp_path):
    code = ("import json\nfrom starter_kernels import starter_path\nfrom harness.judge import judge\n"
            "v = judge(starter_path('reduce'), device='cpu')\n"
            "print(json.dumps({'verdict': v['verdict'], 'stage': v['failed_stage'], 'file': v['kernel_file']}))")
    out = _run(code, installed, tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["verdict"] == "PASS", result
    assert result["file"].startswith(str(installed))
