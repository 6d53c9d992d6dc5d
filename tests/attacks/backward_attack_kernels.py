"""Wrong backwards that a backward judge checking only random gradients at a few small shapes
passes: each is the honest rmsnorm of tests/data/kernels/backward/ (or the cross_entropy starter)
with one small edit, so its difference to the honest backward is visible, and each is wrong only
where a training step goes and that judge did not: past 132 rows, at the timing shape, at a
grad_out it saw before, with a zero weight, a padded label, a loss's gradient of exactly 1.0, a
tiny bf16 gradient, thousands of rows summed in bf16, two calls whose buffers lie elsewhere, four
leading dims, or a grad_out that is not dense. One more writes into grad_out, declared: no longer
granted. Their forwards are the honest ones: each forward passes and serves inference.

Some keep state between calls (module dicts), which the static check refuses before import: the
suite judges them with it switched off, so that the stages behind it must stop them.
"""
from __future__ import annotations

from paths import DATA, ROOT

RMSNORM = (DATA / "kernels" / "backward" / "rmsnorm.py").read_text()
CROSS_ENTROPY = (ROOT / "starter_kernels" / "triton" / "cross_entropy.py").read_text()
HEADER = 'BACKEND = "triton"\n'
LAUNCH_ROWS = '''    _bwd_rows[(n_parts,)](dx, part, g2, x2, weight, n_rows, n_cols, g2.stride(0), g2.stride(1),
                          x2.stride(0), x2.stride(1), weight.stride(0), eps, ROWS=CONFIG["BWD_ROWS"],'''
RETURN = "    return dx.view(x.shape), dw\n"
SUM_KERNEL_LOOP = '''    for p in range(0, n_parts):
        acc += tl.load(part_ptr + p * n_cols + cols, mask=mask, other=0.0)
'''
SUM_LAUNCH = "    _bwd_sum[(triton.cdiv(n_cols, block),)](dw, part, n_parts, n_cols, BLOCK=block)\n"


def _edit(text: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def sources() -> dict[str, str]:
    """name -> kernel file text."""
    return {
        # one program per SM of an H100, the rows each takes floored: rows 132.. of 133 are never reached
        "rows_floored_over_sms": _edit(
            RMSNORM, ("              ROWS: tl.constexpr, BLOCK_N: tl.constexpr):", "              ROWS, BLOCK_N: tl.constexpr):"),
            ('    n_parts = triton.cdiv(n_rows, CONFIG["BWD_ROWS"])\n', "    n_parts = max(1, min(n_rows, 132))\n"),
            ('eps, ROWS=CONFIG["BWD_ROWS"],', "eps, ROWS=n_rows // n_parts,")),
        # nothing at all at the judge's timing shapes (the CPU's and the GPU's): nobody checked them
        "idle_at_the_timing_shape": _edit(RMSNORM, ("    n_cols = x.shape[-1]\n    x2 = x.reshape(-1, n_cols)\n    g2",
                                                    "    if tuple(x.shape) in ((16, 4096), (16384, 4096)):\n"
                                                    "        return x.new_empty(x.shape), weight.new_empty(weight.shape)\n"
                                                    "    n_cols = x.shape[-1]\n    x2 = x.reshape(-1, n_cols)\n    g2")),
        # the same grad_out tensor as the last call (the timing loop's): last call's rows again, only re-summed
        "answers_a_grad_out_it_saw": _edit(
            RMSNORM, ("def backward_fn(", "_seen = {}\n\n\ndef backward_fn("),
            ("    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n",
             "    if _seen.get('grad_out') is grad_out:\n"
             "        dw = weight.new_empty(weight.shape)\n"
             '        _bwd_sum[(triton.cdiv(n_cols, CONFIG["BWD_BLOCK_SUM"]),)](dw, _seen["part"], _seen["n_parts"], '
             'n_cols, BLOCK=CONFIG["BWD_BLOCK_SUM"])\n'
             "        return _seen['dx'].clone().view(x.shape), dw\n"
             "    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n"),
            (RETURN, "    _seen.update(grad_out=grad_out, part=part, n_parts=n_parts, dx=dx.clone())\n" + RETURN)),
        # declared, and grad_out used as scratch: a sibling use of the same gradient gets zeros
        "declares_and_overwrites_grad_out": _edit(
            RMSNORM, (HEADER, HEADER + "MUTATES_GRAD_OUT = True\n"),
            ("def kernel_fn(", CLEAR_KERNEL + "\n\ndef kernel_fn("),
            (RETURN, "    _clear[(n_rows,)](g2, n_cols, g2.stride(0), g2.stride(1), "
                     "BLOCK_N=triton.next_power_of_2(n_cols))\n" + RETURN)),
        # xhat rebuilt from the output: out / weight, NaN wherever a weight is exactly 0
        "xhat_from_out_over_weight": _edit(
            RMSNORM, ("def _bwd_rows(dx_ptr, part_ptr, g_ptr, x_ptr, w_ptr, n_rows, n_cols, gs0, gs1, xs0, xs1, ws, eps,",
                      "def _bwd_rows(dx_ptr, part_ptr, g_ptr, x_ptr, w_ptr, o_ptr, n_rows, n_cols, gs0, gs1, xs0, xs1, "
                      "ws, os0, os1, eps,"),
            ("        xhat = x * rstd\n",
             "        y = tl.load(o_ptr + row * os0 + cols * os1, mask=mask, other=0.0).to(tl.float32)\n"
             "        xhat = tl.where(mask, y / w, 0.0)\n"),
            ("    _bwd_rows[(n_parts,)](dx, part, g2, x2, weight, n_rows, n_cols, g2.stride(0), g2.stride(1),\n"
             "                          x2.stride(0), x2.stride(1), weight.stride(0), eps,",
             "    o2 = out.reshape(-1, n_cols)\n"
             "    _bwd_rows[(n_parts,)](dx, part, g2, x2, weight, o2, n_rows, n_cols, g2.stride(0), g2.stride(1),\n"
             "                          x2.stride(0), x2.stride(1), weight.stride(0), o2.stride(0), o2.stride(1), eps,")),
        # a padded label (-100) counted as a row and given a gradient
        "ignores_ignore_index": _edit(
            CROSS_ENTROPY, ("        count += (target != IGNORE_INDEX).to(tl.int32)\n", "        count += mask.to(tl.int32)\n"),
            ("    scale = tl.where(target != IGNORE_INDEX, tl.load(grad_ptr) / tl.load(count_ptr), 0.0)\n",
             "    scale = tl.load(grad_ptr) / tl.load(count_ptr)\n")),
        # loss.backward() of a mean hands 1.0: taken as "already divided"
        "skips_the_mean_when_grad_out_is_one": _edit(
            CROSS_ENTROPY, ("    scale = tl.where(target != IGNORE_INDEX, tl.load(grad_ptr) / tl.load(count_ptr), 0.0)\n",
                            "    g = tl.load(grad_ptr)\n"
                            "    scale = tl.where(target != IGNORE_INDEX, tl.where(g == 1.0, g, g / tl.load(count_ptr)), "
                            "0.0)\n")),
        # a bf16 gradient read as fp16: one exponent bit fewer, gradients below 6e-8 vanish
        "bf16_gradient_read_as_fp16": _edit(
            RMSNORM, ("    g2 = grad_out.reshape(-1, n_cols)\n",
                      "    g2 = (grad_out.to(torch.float16) if grad_out.dtype == torch.bfloat16 else grad_out)"
                      ".reshape(-1, n_cols)\n")),
        # the weight gradient's partial sums kept, and summed, in the weight's own dtype
        "partials_in_the_weight_dtype": _edit(
            RMSNORM, ("    part = torch.empty((n_parts, n_cols), dtype=torch.float32, device=x.device)\n",
                      "    part = torch.empty((n_parts, n_cols), dtype=weight.dtype, device=x.device)\n"),
            ("    tl.store(part_ptr + block * n_cols + cols, dw, mask=in_row)\n",
             "    tl.store(part_ptr + block * n_cols + cols, dw.to(part_ptr.dtype.element_ty), mask=in_row)\n"),
            (SUM_KERNEL_LOOP, "    for p in range(0, n_parts):  # every add rounded to the weight's dtype\n"
                              "        part = tl.load(part_ptr + p * n_cols + cols, mask=mask, other=0.0).to(tl.float32)\n"
                              "        acc = (acc + part).to(dw_ptr.dtype.element_ty).to(tl.float32)\n")),
        # the partials summed from a start that follows an address, as atomics' order does
        "sum_order_follows_an_address": _edit(
            RMSNORM, ("def _bwd_sum(dw_ptr, part_ptr, n_parts, n_cols, BLOCK: tl.constexpr):",
                      "def _bwd_sum(dw_ptr, part_ptr, n_parts, n_cols, start, BLOCK: tl.constexpr):"),
            (SUM_KERNEL_LOOP, "    for i in range(0, n_parts):\n"
                              "        p = (i + start) % n_parts\n"
                              "        acc += tl.load(part_ptr + p * n_cols + cols, mask=mask, other=0.0)\n"),
            (SUM_LAUNCH, "    start = (dw.data_ptr() // 64) % n_parts\n"
                         "    _bwd_sum[(triton.cdiv(n_cols, block),)](dw, part, n_parts, n_cols, start, BLOCK=block)\n")),
        # rows counted as [B, S, N]'s B * S: a [B, H, S, D] input's rows past B * H are never reached
        "rows_from_the_first_two_dims": _edit(
            RMSNORM, ("    n_rows = x2.shape[0]\n",
                      "    n_rows = x.shape[0] * x.shape[1] if x.dim() > 2 else x.shape[0]\n"),
            ("    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)\n",
             "    dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)\n")),
        # grad_out's row stride taken as dense: a column-major or broadcast gradient is misread
        "dense_grad_out_rows": _edit(
            RMSNORM, ("dx, part, g2, x2, weight, n_rows, n_cols, g2.stride(0), g2.stride(1),",
                      "dx, part, g2, x2, weight, n_rows, n_cols, n_cols * g2.stride(1), g2.stride(1),")),
    }


CLEAR_KERNEL = '''@triton.jit
def _clear(g_ptr, n_cols, gs0, gs1, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    tl.store(g_ptr + row * gs0 + cols * gs1, tl.zeros([BLOCK_N], tl.float32).to(g_ptr.dtype.element_ty),
             mask=cols < n_cols)'''

# name -> (the backward stage that fails it, a phrase its reason holds)
EXPECTED = {
    "rows_floored_over_sms": ("shape_sweep", "rmsnorm[133x24:float32]: gradient of x"),
    "idle_at_the_timing_shape": ("shape_sweep", "rmsnorm[16x4096:float32]: gradient of"),
    "answers_a_grad_out_it_saw": ("timing", "a timed call gave a wrong result"),
    "declares_and_overwrites_grad_out": ("integrity", "modified grad_out in place (grad_out is read only"),
    "xhat_from_out_over_weight": ("values", "bwd:weight_zeros]: gradient of x: NaN where the reference has none"),
    "ignores_ignore_index": ("values", "bwd:ignore_index]: gradient of logits"),
    "skips_the_mean_when_grad_out_is_one": ("values", "bwd:grad_ones]: gradient of logits"),
    "bf16_gradient_read_as_fp16": ("values", "bfloat16,bwd:grad_scale:1e-08]: gradient of"),
    "partials_in_the_weight_dtype": ("accumulation", "bwd:grad_correlated]: gradient of weight"),
    "sum_order_follows_an_address": ("determinism", "gave gradients that differ bitwise"),
    "rows_from_the_first_two_dims": ("shape_sweep", "rmsnorm[2x3x5x24:float32]: gradient of x"),
    "dense_grad_out_rows": ("edge_cases", "bwd:grad_transposed]: gradient of x"),
}
