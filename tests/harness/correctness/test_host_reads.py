"""A scalar read of a tensor's data in a checked or a timed call is host compute: the values leave
the device for Python, where the call computes out of sight of its kernels (float(t) per element,
t.item(), bool(t)). The honest starter's checked and timed calls read none."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from harness.correctness.candidate import observed_call
from harness.correctness.integrity import observation_problem
from harness.correctness import launches
from harness.kernel_types.registry import Case, build_inputs
from harness.timing import measurement
from harness.workers.worker import Log
from paths import ROOT

CASE = Case.make("softmax", {"M": 2, "N": 16}, "float32", seed=3)
TINY = dict(budget_ms=0.0, warmup=1, min_reps=2, max_reps=2)


def _python_softmax(x):
    """Every element read with float(t) and the softmax computed in Python floats."""
    rows = []
    for i in range(x.shape[0]):
        vals = [float(x[i, j]) for j in range(x.shape[1])]
        top = max(vals)
        exps = [2.718281828459045 ** (v - top) for v in vals]
        rows.append([e / sum(exps) for e in exps])
    return torch.tensor(rows, dtype=x.dtype)


def _item_only(x):
    scale = x.abs().max().item()  # one scalar read is enough to be host compute
    return x * (scale / scale)


def _starter():
    spec = importlib.util.spec_from_file_location("softmax_starter", ROOT / "starter_kernels/triton/softmax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_fn


def _checked(fn) -> dict:
    monitor = launches.install()
    args, kwargs = build_inputs(CASE, "cpu")
    return observed_call(fn, args, kwargs, monitor).observations()


@pytest.mark.parametrize("fn", [_python_softmax, _item_only], ids=["float_per_element", "item"])
def test_a_scalar_read_in_a_checked_call_fails_as_host_compute(fn):
    obs = _checked(fn)
    assert obs["host_reads"] == ["aten::_local_scalar_dense"]
    assert "host compute" in observation_problem("smoke", obs, "cpu")


def test_a_scalar_read_in_a_timed_call_is_recorded_too(tmp_path):
    monitor, log = launches.install(), Log(tmp_path)
    measurement.time_kernel(_python_softmax, CASE, "cpu", None, monitor, log, "timing", limits=TINY,
                            second_look=False)
    log._f.flush()
    timed = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    timed = [r for r in timed if r.get("role") == "timed"]
    assert timed and all(r["obs"]["host_reads"] for r in timed)
    assert all("host compute" in observation_problem("rep", r["obs"], "cpu") for r in timed)


def test_the_honest_starter_reads_no_scalar_checked_or_timed(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel_fn = _starter()
    obs = _checked(kernel_fn)
    assert obs["host_reads"] == [] and obs["launches"] >= 1
    assert observation_problem("smoke", obs, "cpu") is None
    monitor, log = launches.install(), Log(tmp_path)
    measurement.time_kernel(kernel_fn, CASE, "cpu", None, monitor, log, "timing", limits=TINY, second_look=False)
    log._f.flush()
    timed = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert all(r["obs"]["host_reads"] == [] for r in timed if r.get("role") == "timed")


def _repr_read(x):
    """Every value read through a tensor's repr, which torch runs with the dispatch modes off."""
    text = "{!r}".format(x.reshape(-1))
    return torch.empty_like(x).fill_(float(len(text) > 0))


def _fstring_read(x):
    return torch.empty_like(x).fill_(float(len(f"{x}") > 0))


@pytest.mark.parametrize("fn, read", [(_repr_read, "Tensor.__repr__"), (_fstring_read, "Tensor.__format__")],
                         ids=["repr", "f-string"])
def test_a_tensor_turned_into_text_in_a_checked_call_is_host_compute(fn, read):
    from harness.correctness.integrity import watch_text_reads
    watch_text_reads()  # as the worker does before the candidate's import
    obs = _checked(fn)
    assert read in obs["host_reads"], obs
    assert "host compute" in observation_problem("smoke", obs, "cpu")
    assert repr(torch.zeros(2)) == "tensor([0., 0.])"  # outside a recorded call, a repr is a repr
