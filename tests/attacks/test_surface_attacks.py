"""Lying kernels that use what no kernel needs (tests/attacks/surface_kernels.py) are refused by the
closed surface before import, each for its own reason, and the honest kernels beside them pass.
The static check is the wall for these classes: the layers behind it are tested elsewhere."""
from __future__ import annotations

import sys

import pytest

from harness.isolation.static_check import check_source
from harness.kernel_types.registry import Case
from judge_batch import judge_batch
from surface_kernels import ATTACKS, CAUGHT_AT_RUN_TIME, REFUSED_BY, STARTER

TARGET = Case.make("softmax", {"M": 4, "N": 64}, "float32", seed=7)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_class_is_refused_before_import_for_its_reason(name):
    text = ATTACKS[name]
    compile(text, name, "exec")  # refused for what it does, not for failing to parse
    rule, word = REFUSED_BY[name]
    found = check_source(text, filename=f"{name}.py")
    assert any(v.rule == rule and word in v.detail for v in found), [v.text() for v in found]


def test_the_honest_kernel_they_are_built_on_passes():
    assert check_source(STARTER) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")
def test_the_judge_fails_them_at_compile_naming_file_line_and_name(tmp_path):
    paths = {}
    for name in ("forged_eager_300ms", "host_apply", "honest"):
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(ATTACKS.get(name, STARTER))
    verdicts = judge_batch(paths, TARGET)
    assert verdicts["honest"]["verdict"] == "PASS", verdicts["honest"]["stages"]
    for name in ("forged_eager_300ms", "host_apply"):
        v = verdicts[name]
        detail = next(s["detail"] for s in v["stages"] if s["name"] == "compile")
        assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile"), detail
        rule, word = REFUSED_BY[name]
        assert f"{name}.py:" in detail and rule in detail and word in detail, detail


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")
def test_behind_the_check_a_repr_read_and_a_replaced_tensor_method_fail_integrity(tmp_path):
    """With the static check switched off, the run-time layers hold on their own: the recorder
    counts a tensor's repr as a host read, the identity check names the replaced Tensor.detach."""
    paths = {}
    for name in CAUGHT_AT_RUN_TIME:
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(ATTACKS[name])
    verdicts = judge_batch(paths, TARGET, static_check=False)
    for name, word in CAUGHT_AT_RUN_TIME.items():
        v = verdicts[name]
        detail = next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")
        assert (v["verdict"], v["failed_stage"]) == ("FAIL", "integrity"), (name, detail)
        assert word in detail, (name, detail)
