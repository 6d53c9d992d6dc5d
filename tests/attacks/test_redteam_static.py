"""The interpreter's back doors a candidate found past the static check, each now refused before
import with its rule and line (tests/attacks/redteam_static_kernels.py), and the honest constructs
beside them still allowed. Cheap: the check reads text; one file goes through the whole judge."""
from __future__ import annotations

import pytest

from harness.isolation.static_check import check_source
from redteam_static_kernels import ATTACKS, HONEST, LATER_MODULES


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_back_door_is_refused_with_its_rule(name):
    text, rule, word = ATTACKS[name]
    compile(text, name, "exec")  # refused for what it does, not for failing to parse
    found = check_source(text)
    assert any(v.rule == rule and word in v.detail for v in found), [v.text() for v in found]


@pytest.mark.parametrize("module", LATER_MODULES)
def test_modules_that_run_code_later_or_elsewhere_are_not_imported(module):
    parent, _, leaf = module.rpartition(".")
    for text in [f"import {module}\n"] + ([f"from {parent} import {leaf}\n"] if parent else []):
        assert [v.rule for v in check_source(text)] == ["import not allowed"], text


@pytest.mark.parametrize("attr", ["__self__", "__objclass__", "__func__", "__closure__", "__reduce__",
                                  "__reduce_ex__", "__wrapped__", "__setattr__", "__class__", "__globals__",
                                  "f_globals", "numpy", "tolist"])
def test_a_literal_name_in_hasattr_is_held_to_the_rules_of_a_dot_and_getattr_is_refused(attr):
    dotted = {(v.line, v.rule) for v in check_source(f"def f(o):\n    return o.{attr}\n")}
    named = {(v.line, v.rule) for v in check_source(f'def f(o):\n    return hasattr(o, "{attr}")\n')}
    assert named == dotted and named, (named, dotted)
    for call in (f'getattr(o, "{attr}")', f'getattr(o, "{attr}", None)'):
        assert (2, "formatting") in {(v.line, v.rule) for v in check_source(f"def f(o):\n    return {call}\n")}


def test_the_honest_constructs_beside_each_rule_pass():
    """hasattr of a plain name, isinstance, an object made and used in the call, try/finally, a dict
    the call made and fills: what a kernel uses stays allowed."""
    assert check_source(HONEST) == []


def test_a_back_door_fails_the_judge_at_compile_before_import(tmp_path):
    from harness.judge import judge
    path = tmp_path / "builtins_through_self.py"
    path.write_text(ATTACKS["builtins_through_self"][0])
    v = judge(path, device="cpu", timeout_s=120)
    detail = next(s["detail"] for s in v["stages"] if s["name"] == "compile")
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "compile"), detail
    assert "formatting" in detail and "getattr" in detail, detail
