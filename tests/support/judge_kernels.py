"""Kernel files for the judge's own tests, made from one correct softmax by small edits.

Each bad variant is a hack or a bug the judge must catch, named by the stage that must catch it.
Generating them from one template keeps each variant's difference to the correct kernel visible.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from paths import GOOD_KERNELS

GOOD = GOOD_KERNELS  # correct kernels written unlike the starters

TEMPLATE = '''
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"
{PRELUDE}

@triton.jit
def _softmax_row(x_ptr, y_ptr, n, x_stride, y_stride, jitter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
{BODY}
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
{WRAPPER}
'''

BODY = '''    e = tl.exp(x - tl.max(x, 0))
    y = e / tl.sum(e, 0)'''

WRAPPER = '''    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _softmax_row[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), 0.0,
                                 BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)'''

LAUNCH = '''    _softmax_row[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), 0.0,
                                 BLOCK=triton.next_power_of_2(x2.shape[1]))'''


# The judge's deadline for the `hang` variant: it spins a core until then, so a short one saves the
# suite's time; long enough for a spawned worker on a busy machine to reach the call that hangs
# (about 1 s quiet), so the verdict is TIMEOUT at compile wherever it is judged. A worker forked
# from a judge session's pre-imported one reaches it in a fraction of a second.
HANG_TIMEOUT_S = 6
FORKED_HANG_TIMEOUT_S = 3


def timeout_s(name: str, forked: bool) -> float:
    """The judge's deadline for variant `name`: the hang's short one, ample time for any other."""
    if name != "hang":
        return 180
    return FORKED_HANG_TIMEOUT_S if forked else HANG_TIMEOUT_S


def source(body: str = BODY, wrapper: str = WRAPPER, prelude: str = "") -> str:
    return TEMPLATE.format(BODY=body, WRAPPER=wrapper, PRELUDE=prelude)


def wrap(*lines: str) -> str:
    """A wrapper: flatten to rows, then the given lines."""
    head = ["shape = x.shape", "x2 = x.reshape(-1, shape[-1]).contiguous()", "y = torch.empty_like(x2)"]
    return textwrap.indent("\n".join(textwrap.dedent(line) for line in head + list(lines)), "    ")


# a call counter: state a kernel may not keep (refused before import), for the variants that show
# what the stages behind the static check catch
COUNTER = "_calls = [0]"
COUNT = "    _calls[0] += 1\n"

# name -> (source, expected verdict, expected failed stage)
VARIANTS: dict[str, tuple[str, str, str | None]] = {
    "correct": (source(), "PASS", None),
    # --- compile
    "syntax_error": ("KERNEL_TYPE = 'softmax'\nBACKEND = 'triton'\ndef kernel_fn(x)\n    return x\n", "FAIL", "compile"),
    "wrong_signature": (source().replace("def kernel_fn(x):", "def kernel_fn(x, dim=-1):"), "FAIL", "compile"),
    "import_error": (source(prelude="import a_module_that_does_not_exist"), "FAIL", "compile"),
    "triton_compile_error": (source(body="    y = x + tl.arange(0, 100).to(tl.float32)"), "FAIL", "compile"),
    # --- smoke
    "wrong_math": (source(body="    e = tl.exp(x)\n    y = e / (tl.sum(e, 0) + 1.0)"), "FAIL", "smoke"),
    "zeros": (source(body="    y = tl.zeros_like(x)"), "FAIL", "smoke"),
    "precision_lost": (source(body=BODY.replace("tl.exp(x - tl.max(x, 0))",
                                                "tl.exp((x - tl.max(x, 0)).to(tl.float16).to(tl.float32))")),
                       "FAIL", "smoke"),
    # --- shape_sweep
    "one_block_only": (source(wrapper=WRAPPER.replace("BLOCK=triton.next_power_of_2(x2.shape[1])",
                                                      "BLOCK=min(1024, triton.next_power_of_2(x2.shape[1]))")),
                       "FAIL", "shape_sweep"),
    "fp32_output_for_fp16": (source(wrapper=wrap("x2 = x2.float()", "y = torch.empty_like(x2)", LAUNCH,
                                                 "return y.view(shape)")), "FAIL", "shape_sweep"),
    # --- stability
    "no_max_subtraction": (source(body="    e = tl.exp(x)\n    y = e / tl.sum(e, 0)"), "FAIL", "stability"),
    "clamps_logits": (source(body="    x = tl.minimum(tl.maximum(x, -60.0), 60.0)\n" + BODY), "FAIL", "stability"),
    # --- determinism: counting calls is state, refused before import (harness/isolation/purity.py);
    # RUN_TIME says what the determinism stage finds with the static check switched off
    "jitter": (source(prelude=COUNTER, wrapper=COUNT + WRAPPER.replace(", 0.0,\n", ", (_calls[0] % 3) * 1e-9,\n"),
                      body=BODY + "\n    y = y + jitter"), "FAIL", "compile"),
    "unordered_sum": (source(prelude=COUNTER,
                             wrapper=COUNT + WRAPPER.replace(", 0.0,\n", ", float((_calls[0] * 7919) % x2.shape[1]),\n"),
                             body=("    shift = (cols * 0 + jitter).to(tl.int32)\n"
                                   "    xs = tl.load(x_ptr + row * x_stride + (cols + shift) % n, mask=mask,\n"
                                   "                 other=float('-inf')).to(tl.float32)\n"
                                   "    top = tl.max(x, 0)\n"
                                   "    y = tl.exp(x - top) / tl.sum(tl.exp(xs - top), 0)")),
                      "FAIL", "compile"),
    # --- edge_cases
    "assumes_contiguous": (source(wrapper=WRAPPER.replace(".contiguous()", "").replace(
        "x2.stride(0), y.stride(0)", "x2.shape[1], y.stride(0)")), "FAIL", "edge_cases"),
    "two_dims_only": (source(wrapper=WRAPPER.replace("x.reshape(-1, shape[-1])", "x.reshape(shape[0], -1)")),
                      "FAIL", "edge_cases"),
    # --- integrity
    # torch.softmax is not on the kernel allow-list: refused before import
    "calls_reference": (source(wrapper=wrap(LAUNCH, "return torch.softmax(x, dim=-1)")), "FAIL", "compile"),
    # tensor operators are syntax the check cannot refuse: the integrity stage sees their aten ops
    "operator_compute": (source(wrapper=wrap(LAUNCH, "return y.view(shape) * 1.0 + 0.0")), "FAIL", "integrity"),
    "writes_into_input": (source(wrapper=wrap("y = x2", LAUNCH, "return y.view(shape)")), "FAIL", "integrity"),
    # state, refused before import (RUN_TIME: the replay check, with the static check off):
    # keyed by the input tensor object (held, so its id stays its own), not its address: a new
    # tensor never hits a stale entry, so only a caller that refills the same buffers in place (the
    # replay check) sees it
    "result_cache": (source(prelude="_replay = {}",
                            wrapper=wrap("hit = _replay.get(id(x))",
                                         "if hit is not None and hit[0] is x: return hit[1].clone()",
                                         LAUNCH, "_replay[id(x)] = (x, y.view(shape).clone())",
                                         "return y.view(shape)")), "FAIL", "compile"),
    # numpy is refused by the static check, before import
    "numpy_no_launch": (source(wrapper=wrap("import numpy as np", "a = x.detach().float().numpy().astype(np.float64)",
                                            "e = np.exp(a - a.max(-1, keepdims=True))",
                                            "return torch.from_numpy((e / e.sum(-1, keepdims=True)).astype(a.dtype)).to(x.dtype)")),
                        "FAIL", "compile"),
    # state too (RUN_TIME: the earlier output changes)
    "reused_output_buffer": (source(prelude="_buffers = {}", wrapper=wrap(
        "key = (tuple(x2.shape), x.dtype)",
        "y = _buffers.setdefault(key, torch.empty_like(x2))", LAUNCH, "return y.view(shape)")), "FAIL", "compile"),
    # --- the process itself
    # spins until its deadline (wall time): nothing that blocks without a core, torch.futures
    # among them, is on the kernel allow-list (harness/isolation/kernel_surface.py)
    "hang": (source(wrapper="    while True:\n        pass"), "TIMEOUT", "compile"),
    # a wild pointer: the interpreter reads far outside the tensor, as a GPU kernel would fault
    "segfault": (source(body="    x = tl.load(x_ptr + (1 << 44) + cols)\n" + BODY), "CRASH", "compile"),
    "exits_early": (source(wrapper="    raise SystemExit(0)"), "CRASH", "compile"),
    # what torch raises after an illegal address: the context is poisoned, so the worker ends
    "cuda_error": (source(wrapper="    raise RuntimeError('CUDA error: an illegal memory access was encountered')"),
                   "CRASH", "compile"),
    "noisy_but_correct": (source(wrapper='    print("noise on stdout " * 100)\n' + WRAPPER), "PASS", None),
}

# The variants that keep state between calls, refused before import, and the stage that fails each
# with the static check switched off: the layers behind it must hold on their own.
RUN_TIME = {"jitter": ("FAIL", "determinism"), "unordered_sum": ("FAIL", "determinism"),
            "result_cache": ("FAIL", "integrity"), "reused_output_buffer": ("FAIL", "integrity")}


def write_variants(folder: Path, names=None) -> dict[str, Path]:
    paths = {}
    for name, (text, _, _) in VARIANTS.items():
        if names is None or name in names:
            paths[name] = folder / f"{name}.py"
            paths[name].write_text(text)
    return paths
