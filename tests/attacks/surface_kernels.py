"""Lying kernels that rest on what a kernel never needs, each refused by the closed surface before
import (harness/isolation/kernel_surface.py): the honest softmax starter's kernel, plus

- forged eager lines written natively to fd 3 (the witness socket) through a tensor's private
  storage method, `_write_file`: eager claimed at 300 ms; and at 5 s with the candidate's own first
  round made wide on purpose, so that the judge re-times it;
- forged case records written natively to fd 4 (the worker's events file), torch.softmax doing the work;
- all compute on the host through `Tensor.apply_`, the Triton kernel only copying;
- every element read with `float(t)`, the softmax computed in Python floats;
- dormant: on its 400th call, `_write_file` to every fd from 3 to 63 (a user's open files, served);

and four that rest on what the surface allowed before its text, state and attribute-store rules:

- every value read on the host through `"{!r}".format(t)` (a tensor's repr runs with torch's dispatch
  modes off, so the run-time recorder saw no scalar read);
- a module-level counter: wrong after 5000 calls, more than any verdict makes (correct when judged,
  wrong once served);
- `"{0.__globals__[os].sys.modules}".format(torch.cuda.synchronize)`: attributes walked inside a
  format string, to see whether the judge's modules are loaded, and wrong when they are not;
- `TensorClass = torch.Tensor; TensorClass.detach = ...`: half the rows computed when the judge
  saves the output after the timed region (a faster time, correct saved outputs).
"""
from __future__ import annotations

from paths import ROOT

STARTER = (ROOT / "starter_kernels" / "triton" / "softmax.py").read_text()


def _with(prelude: str, body: str) -> str:
    """The starter, with `prelude` at module level and `body` run at the start of every kernel_fn call."""
    lines = "".join(f"    {line}\n" for line in body.splitlines())
    return STARTER.replace("\n\ndef kernel_fn(x):\n", f"\n\n{prelude}\n\n\ndef kernel_fn(x):\n{lines}", 1)


def _native_write(fd: str, text: str) -> str:
    """Lines writing `text` to `fd` through a uint8 tensor's storage, in native code."""
    return (f"_buf = torch.tensor(list({text}.encode()), dtype=torch.uint8)\n"
            f"_buf._typed_storage()._untyped_storage._write_file({fd}, True, False, 1)")


FORGE = "_state = {'calls': 0, 'slow': 0}\n"
EAGER_300MS = '"S eager 0\\nE eager 0 300000.0\\n"'
EAGER_5S = '"S eager 0\\nE eager 0 5000000.0\\n"'
CASE_RECORD = '\'{"role": "case", "stage": "smoke", "obs": {"launches": 1, "forbidden": []}}\\n\''

ATTACKS = {
    "forged_eager_300ms": _with("import torch\n" + FORGE,
                                "_state['calls'] += 1\nif _state['calls'] == 1:\n"
                                + "".join(f"    {l}\n" for l in _native_write("3", EAGER_300MS).splitlines())),
    "forged_eager_5s_wide_round": _with("import torch\n" + FORGE,
                                        "_state['calls'] += 1\nif _state['calls'] == 1:\n"
                                        + "".join(f"    {l}\n" for l in _native_write("3", EAGER_5S).splitlines())
                                        + "for _ in range(200000 if _state['calls'] % 2 else 1):\n"
                                          "    _state['slow'] += 1\n"),
    "forged_case_records": STARTER.replace(
        "\n\ndef kernel_fn(x):\n", "\n\nimport torch\n\n\ndef kernel_fn(x):\n"
        + "".join(f"    {l}\n" for l in _native_write("4", CASE_RECORD).splitlines())
        + "    return torch.softmax(x, -1)\n", 1),
    "host_apply": _with("import torch", "x = x.clone()\nx.apply_(lambda v: v * 1.0)"),
    "float_per_element": _with("import torch",
                               "vals = [float(x[i, j]) for i in range(x.shape[0]) for j in range(x.shape[1])]"),
    "dormant_every_fd": _with("import torch\n" + FORGE,
                              "_state['calls'] += 1\nif _state['calls'] == 400:\n"
                              "    for fd in range(3, 64):\n"
                              "        _buf = torch.tensor([0] * 64, dtype=torch.uint8)\n"
                              "        _buf._typed_storage()._untyped_storage._write_file(fd, True, False, 1)"),
}

DEFERRED_DETACH = STARTER[:STARTER.index("\n\ndef kernel_fn(x):")] + '''
import torch

TensorClass = torch.Tensor
ORIGINAL_DETACH = TensorClass.detach
PENDING = []


def detach_then_finish(self, *args, **kwargs):
    while PENDING:
        PENDING.pop()()
    return ORIGINAL_DETACH(self, *args, **kwargs)


TensorClass.detach = detach_then_finish


def launch(y2, x2):
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(x2.shape[1]))
    _softmax_kernel[(x2.shape[0],)](
        y2, x2, x2.shape[1], x2.stride(0), x2.stride(1), BLOCK_N=block_n, ONE_BLOCK=x2.shape[1] <= block_n,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])


def kernel_fn(x):
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    x2 = x.reshape(-1, x.shape[-1])
    y2 = y.view(-1, x.shape[-1])
    half = max(1, x2.shape[0] // 2)
    launch(y2.narrow(0, 0, half), x2.narrow(0, 0, half))  # inside the timed call
    rest = x2.shape[0] - half
    if rest:  # when the judge saves y
        PENDING.append(lambda: launch(y2.narrow(0, half, rest), x2.narrow(0, half, rest)))
    return y
'''

ATTACKS.update({
    "repr_host_read": _with("import torch", 'text = "{!r}".format(x.reshape(-1))\nvalues = text.split(",")'),
    "counter_trojan": _with('STATE = {"calls": 0}\nLIMIT = 5000',
                            'STATE["calls"] += 1\nif STATE["calls"] > LIMIT:\n    return x.new_zeros(x.shape)'),
    "judge_detect": _with("import torch",
                          'loaded = "{0.__globals__[os].sys.modules}".format(torch.cuda.synchronize)\n'
                          'if "harness.timing.witness" not in loaded:\n    return x.new_zeros(x.shape)'),
    "deferred_detach": DEFERRED_DETACH,
})

# name -> (rule, a word its detail names): what refuses each before import
REFUSED_BY = {
    "forged_eager_300ms": ("private name", "_typed_storage"),
    "forged_eager_5s_wide_round": ("private name", "_write_file"),
    "forged_case_records": ("private name", "_untyped_storage"),
    "host_apply": ("host compute", "apply_"),
    "float_per_element": ("host compute", "float("),
    "dormant_every_fd": ("private name", "_write_file"),
    "repr_host_read": ("formatting", "'{!r}'.format"),
    "counter_trojan": ("state", "STATE"),
    "judge_detect": ("formatting", "__globals__"),
    "deferred_detach": ("attribute store", "TensorClass.detach"),
}
# what fails them at run time with the static check switched off: the recorder counts a tensor's
# repr as a host read, and the identity check holds torch.Tensor's methods
CAUGHT_AT_RUN_TIME = {"repr_host_read": "Tensor.__repr__", "deferred_detach": "torch.Tensor.detach"}
