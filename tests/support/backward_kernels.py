"""Backward kernel files for the judge's backward tests: the honest rmsnorm of
tests/data/kernels/backward/ and wrong ones made from it by one small edit each, so each
variant's difference to the honest backward is visible. Each names the backward stage that must
refuse it and a phrase its reason must contain."""
from __future__ import annotations

from pathlib import Path

from paths import DATA

BACKWARD_KERNELS = DATA / "kernels" / "backward"
HONEST = (BACKWARD_KERNELS / "rmsnorm.py").read_text()
RETURN = "    return dx.view(x.shape), dw\n"
SUM_LAUNCH = "    _bwd_sum[(triton.cdiv(n_cols, block),)](dw, part, n_parts, n_cols, BLOCK=block)\n"
DX_ALLOC = "    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n"


def _edit(old: str, new: str, text: str = HONEST) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


# name -> (text, backward verdict, failed backward stage, a phrase the reason contains)
VARIANTS = {
    "honest": (HONEST, "PASS", None, ""),
    # writing into grad_out is refused, declared or not: autograd hands it on to the output's other uses
    "declared_grad_out_write": (_edit(RETURN, "    grad_out.zero_()\n" + RETURN,
                                      _edit('BACKEND = "triton"\n', 'BACKEND = "triton"\nMUTATES_GRAD_OUT = True\n')),
                                "FAIL", "integrity", "grad_out is read only"),
    "off_by_factor": (_edit("        dx = rstd * (wg - xhat * c)\n", "        dx = 2.0 * rstd * (wg - xhat * c)\n"),
                      "FAIL", "compile", "gradient of x"),
    "missing_weight_gradient": (_edit(RETURN, "    return (dx.view(x.shape),)\n"),
                                "FAIL", "compile", "missing: weight"),
    "first_block_only": (_edit("    for p in range(0, n_parts):\n", "    for p in range(0, 1):\n"),
                         "FAIL", "compile", "gradient of weight"),  # the first case has two blocks
    "calls_pytorch": (_edit(SUM_LAUNCH, "    dw = part.sum(0).to(weight.dtype)\n"),
                      "FAIL", "integrity", "aten::sum"),
    "too_many_gradients": (_edit(RETURN, "    return dx.view(x.shape), dw, dw\n"),
                           "FAIL", "compile", "remove the extra ones"),
    "wrong_shape": (_edit(RETURN, "    return dx.view(x.shape), part\n"),
                    "FAIL", "compile", "each gradient is shaped like its input"),
    "returns_a_tensor": (_edit(RETURN, "    return dx.view(x.shape)\n"),
                         "FAIL", "compile", "must return a tuple"),
    "mutates_grad_out": (_edit(RETURN, "    grad_out.zero_()\n" + RETURN), "FAIL", "integrity", "grad_out is read only"),
    # the gradient it returns is grad_out's own storage
    "aliases_grad_out": (_edit(DX_ALLOC, "    dx = g2 if g2.is_contiguous() else x.new_empty((n_rows, n_cols))\n",
                               _edit('BACKEND = "triton"\n', 'BACKEND = "triton"\nMUTATES_GRAD_OUT = True\n')),
                         "FAIL", "integrity", "shares storage with grad_out"),
    "aliases_an_input": (_edit(DX_ALLOC, "    dx = x2 if x2.is_contiguous() else x.new_empty((n_rows, n_cols))\n"),
                         "FAIL", "integrity", "shares storage with x"),
    "wrong_signature": (_edit("def backward_fn(grad_out, out, x, weight, eps=1e-6):",
                              "def backward_fn(grad_out, x, weight, eps=1e-6):"),
                        "FAIL", "compile", "def backward_fn(grad_out, out, x, weight, eps=1e-06)"),
}


def write(folder: Path) -> dict[str, Path]:
    paths = {}
    for name, (text, *_rest) in VARIANTS.items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    return paths
