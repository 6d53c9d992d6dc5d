"""Finding KernelBench problems: a checkout's levels, id lists, single files, and the contract."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from autokernel.errors import UsageError, UserError
from autokernel.judging import kb_problems as kb
from paths import KERNELBENCH

HERE = KERNELBENCH


def test_parse_ids():
    assert kb.parse_ids("1-3,17, 5") == {1, 2, 3, 5, 17}
    assert kb.parse_ids(None) is None and kb.parse_ids("") is None
    for bad in ("1-", "a", "3-1"):
        with pytest.raises(UsageError):
            kb.parse_ids(bad)


def test_find_problems_in_either_layout(tmp_path):
    # the folder that holds level1/ (our tests) ...
    found = kb.find_problems(HERE, 1)
    assert [(p.problem_id, p.name, p.level) for p in found] == [(19, "ReLU", 1), (23, "Softmax", 1), (96, "ScaleByTiny", 1)]
    assert found[0].key == "19_ReLU"
    assert [p.problem_id for p in kb.find_problems(HERE, 1, "20-96")] == [23, 96]
    # ... or KernelBench's repository root, which holds KernelBench/level1/
    shutil.copytree(HERE / "level2", tmp_path / "KernelBench" / "level2")
    assert [p.key for p in kb.find_problems(tmp_path, 2)] == ["12_Gemm_Multiply_LeakyReLU"]
    with pytest.raises(UsageError, match="no level4/"):
        kb.find_problems(tmp_path, 4)
    with pytest.raises(UsageError, match="no problem with id 7"):
        kb.find_problems(HERE, 1, "7")


def test_single_file_and_contract_checks(tmp_path):
    p = kb.load_problems(HERE / "level3" / "1_MLP.py")[0]
    assert (p.problem_id, p.name, p.level) == (1, "MLP", 3)
    with pytest.raises(UsageError, match="--level"):
        kb.load_problems(HERE)
    bad = tmp_path / "5_Bad.py"
    bad.write_text("import torch\nclass Model: pass\n")
    with pytest.raises(UsageError, match="get_inputs, get_init_inputs"):
        kb.check_problem_file(bad)
    kb.check_problem_file(HERE / "level1" / "19_ReLU.py")
    kb.check_solution_file(HERE / "solutions" / "19_ReLU_correct.py")
    with pytest.raises(UsageError, match="defines no ModelNew"):
        kb.check_solution_file(bad)
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    kb.check_solution_file(broken)  # a syntax error is the solution's failure, judged, not a usage error


def test_hub_loading_without_datasets_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(UserError, match="needs the `datasets` package") as e:
        kb.hub_problems(1, tmp_path)
    assert "pip install datasets" in e.value.hint
