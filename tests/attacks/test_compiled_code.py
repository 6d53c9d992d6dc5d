"""Kernels the interpreter runs right and a GPU would not (tests/attacks/compiled_code_kernels.py):
a dot accumulating in fp16, a relaxed atomic ticket, a ticket kept with plain loads and stores, a
tensor descriptor made on the device. Each ends in FAIL for its named reason: the first, second and
fourth read from the code Triton compiles for sm_90 (harness/compiling/ir_rules.py), the third from
the programs' memory accesses (harness/correctness/shared_accesses.py), the fifth from the hint held to its
values (harness/correctness/compiler_hints.py). The honest ticket kernel
they were made from passes beside them."""
from __future__ import annotations

import sys

import pytest

import compiled_code_kernels
from harness.kernel_types.registry import Case
from judge_batch import judge_batch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
TARGETS = {"cross_entropy": {"N": 16, "V": 256}, "matmul": {"M": 64, "K": 80, "N": 48}, "softmax": {"M": 16, "N": 256}}
KERNELS = {"cross_entropy": ("relaxed_ticket_mean", "plain_ticket_mean", "ticket_mean"),
           "matmul": ("fp16_accumulator_matmul",),
           "softmax": ("device_descriptor_softmax", "false_alignment_softmax")}
# name -> phrases its reason must hold
EXPECTED = {
    "fp16_accumulator_matmul": ("does not compile for sm_90", "it would not run as the interpreter ran it",
                                "a tl.dot of f16 operands accumulates in f16"),
    "relaxed_ticket_mean": ("would not run as the interpreter ran it", 'an atomic add with sem="relaxed"'),
    "plain_ticket_mean": ("program order: in the launch of _ticket_kernel", "byte 0 of ticket_ptr",
                          "no atomic orders the two"),
    "false_alignment_softmax": ("false compiler hint in _softmax_rows (false_alignment_softmax.py:",
                                "tl.multiple_of(..., 16) is given the value", "not a multiple of 16"),
    "device_descriptor_softmax": ("tl.make_tensor_descriptor", "needs global scratch memory",
                                  "triton.set_allocator"),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("compiled_code")
    sources = compiled_code_kernels.sources()
    verdicts = {}
    for kernel_type, names in KERNELS.items():
        paths = {}
        for name in names:
            paths[name] = folder / f"{name}.py"
            paths[name].write_text(sources[name])
        verdicts.update(judge_batch(paths, Case.make(kernel_type, TARGETS[kernel_type], "float32")))
    return verdicts


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fails_for_its_named_reason(judged, name):
    v = judged[name]
    assert v["verdict"] == "FAIL", _reason(v)[:2000]
    for phrase in EXPECTED[name]:
        assert phrase in _reason(v), (v["failed_stage"], _reason(v)[:2000])


def test_the_honest_ticket_passes_beside_them(judged):
    v = judged["ticket_mean"]
    assert v["verdict"] == "PASS", _reason(v)[:2000]
