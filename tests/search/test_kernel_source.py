import pytest

from autokernel.search.kernel_source import (apply_config, check_constraints, description_of,
                                      extract_last_python_block, read_literals)

KERNEL = '''"""A softmax — one program per row."""
import triton

KERNEL_TYPE = "softmax"
BACKEND = "triton"
TUNABLES = {"BLOCK_SIZE": [256, 512, 1024], "num_warps": [2, 4, 8]}
CONSTRAINTS = ["BLOCK_SIZE >= 32 * num_warps", "num_warps <= 8"]
CONFIG = {
    "BLOCK_SIZE": 1024,   # rows up to 1K in one block
    "num_warps": 4,
}


def kernel_fn(x):
    return x  # é
'''


# ------------------------------------------------------------------ extract_last_python_block
def test_last_python_block_wins():
    reply = "Try this:\n```python\nA = 1\n```\nBetter:\n```python\nB = 2\n```\nDone."
    assert extract_last_python_block(reply) == "B = 2\n"


def test_py_tag_and_longer_fences():
    reply = "````py\ns = '```'\nX = 1\n````\n"
    assert extract_last_python_block(reply) == "s = '```'\nX = 1\n"


def test_untagged_block_counts_only_when_it_is_python_with_definitions():
    assert extract_last_python_block("```\ndef kernel_fn(x):\n    return x\n```") == \
        "def kernel_fn(x):\n    return x\n"
    # shell commands and program output in untagged blocks are not kernels
    assert extract_last_python_block("```\npip install triton\n```") is None
    assert extract_last_python_block("```python\nA = 1\n```\nthen run\n```\nls -la\n```") == "A = 1\n"


def test_no_block_unclosed_block_and_empty_block():
    assert extract_last_python_block("I could not find a faster approach.") is None
    assert extract_last_python_block("") is None
    # a reply cut off by the token limit: the code is truncated, so it is not a kernel
    assert extract_last_python_block("```python\ndef kernel_fn(x):\n    return") is None
    assert extract_last_python_block("```python\n\n```") is None


def test_other_languages_are_ignored():
    reply = "```python\nA = 1\n```\n```cuda\n__global__ void k() {}\n```\n```json\n{}\n```"
    assert extract_last_python_block(reply) == "A = 1\n"


def test_description_is_first_prose_line():
    reply = "\n**Fuse the two passes** into one online pass.\n```python\n# not this\n```"
    assert description_of(reply) == "Fuse the two passes into one online pass."
    assert description_of("```python\nA = 1\n```") == ""
    assert len(description_of("x" * 500)) == 160


# ------------------------------------------------------------------ read_literals
def test_read_literals_without_importing():
    found = read_literals(KERNEL + "\nraise SystemExit('imported!')\n")
    assert found["KERNEL_TYPE"] == "softmax" and found["BACKEND"] == "triton"
    assert found["TUNABLES"]["num_warps"] == [2, 4, 8]
    assert found["CONSTRAINTS"][0] == "BLOCK_SIZE >= 32 * num_warps"
    assert found["CONFIG"] == {"BLOCK_SIZE": 1024, "num_warps": 4}


def test_read_literals_absent_names_and_errors():
    assert read_literals("X = 1\n") == {}
    with pytest.raises(ValueError, match="plain literal"):
        read_literals("CONFIG = dict(a=1)\n")
    with pytest.raises(ValueError, match="does not parse"):
        read_literals("def broken(:\n")


# ------------------------------------------------------------------ check_constraints
@pytest.mark.parametrize("expr, ok", [
    ("BLOCK_M * BLOCK_N <= 128 * 128", True),
    ("BLOCK_M // 16 % 2 == 0 and not (num_warps > 8)", True),
    ("min(BLOCK_M, BLOCK_N) >= 64 or max(BLOCK_M, 1) < 2", True),
    ("16 <= BLOCK_M < 64", False),
    ("2 ** num_warps == 16", True),
    ("BLOCK_M / 0 > 1", False),
    ("-BLOCK_M + BLOCK_N == 0", True),
])
def test_constraint_grammar(expr, ok):
    assert check_constraints([expr], {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4}) is ok


def test_constraints_all_must_hold_and_accept_a_string():
    config = {"BLOCK_SIZE": 64, "num_warps": 4}
    assert check_constraints(None, config) and check_constraints([], config)
    assert check_constraints("BLOCK_SIZE >= 32", config)
    assert not check_constraints(["BLOCK_SIZE >= 32", "BLOCK_SIZE >= 32 * num_warps"], config)


@pytest.mark.parametrize("expr", [
    "__import__('os').system('true')",
    "BLOCK_M.bit_length() > 1",
    "[x for x in range(3)]",
    "abs(BLOCK_M) > 1",
    "min(BLOCK_M, key=None) > 1",
    "'a' == 'a'",
    "BLOCK_M if 1 else 2",
    "2 ** 10 ** 10 > 1",
    "BLOCK_M in (1, 2)",
    "UNKNOWN > 1",
    "BLOCK_M >",
])
def test_constraint_evaluator_refuses_everything_else(expr):
    with pytest.raises(ValueError):
        check_constraints([expr], {"BLOCK_M": 64})


# ------------------------------------------------------------------ apply_config
def test_apply_config_rewrites_only_config():
    out = apply_config(KERNEL, {"BLOCK_SIZE": 512, "num_warps": 8})
    assert read_literals(out)["CONFIG"] == {"BLOCK_SIZE": 512, "num_warps": 8}
    before, after = KERNEL.split("CONFIG = ")[0], KERNEL.split("}\n", 2)[-1]
    assert out.startswith(before) and out.endswith(after)
    assert 'CONFIG = {"BLOCK_SIZE": 512, "num_warps": 8}\n' in out
    assert apply_config(out, {"BLOCK_SIZE": 1024, "num_warps": 4}).count("\n") == out.count("\n")


def test_apply_config_keeps_annotation_and_unicode_and_uses_last_assignment():
    src = "# naïve ünïcode\nCONFIG: dict = {'A': 1}  # trailing\nCONFIG = {'A': 2}\nY = 'é'\n"
    out = apply_config(src, {"A": 3, "mode": "fast", "flag": True})
    assert out == ("# naïve ünïcode\nCONFIG: dict = {'A': 1}  # trailing\n"
                   'CONFIG = {"A": 3, "mode": "fast", "flag": True}\nY = \'é\'\n')


def test_apply_config_without_config_is_an_error():
    with pytest.raises(ValueError, match="no module-level CONFIG"):
        apply_config("def f():\n    CONFIG = {}\n", {"A": 1})
