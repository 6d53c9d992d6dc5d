"""The backward's own cases, beside the forward's: the shapes a GPU and a model give a backward, the
values and layouts a training step hands it, sums that grow, and repeated calls.

- Rows past the SM counts of the GPUs a kernel targets (108 on an A100, 132 on an H100 and H200)
  and ragged past a multiple of them: a backward that sizes its grid as min(rows, SMs) and floors
  the rows each program takes leaves the last rows alone. Narrow rows; for attention and rotary
  the rows are heads (a grid over B x H).
- Four leading dims for the row types ([B, H, S, N], QK-norm's): a backward that counts rows as
  shape[0] * shape[1] leaves most of them alone.
- The timing shape: every timed call is checked too, but a backward wrong only there must fail a
  checked case as well.
- Values (harness/correctness/backward_values.py): grad_out all ones (cross_entropy's scalar 1.0),
  scaled to 1e-8 (in bf16 where it runs: below fp16's smallest subnormal) and to 1e4, norm weights
  with exact zeros, cross_entropy targets with ignore_index.
- grad_out laid out column-major and broadcast (stride 0), beside the forward's strided and offset
  layouts.
- Accumulation: weight gradients summed over many rows under a gradient correlated with the output
  (every term one sign: the sums grow with the rows), in every dtype the target serves (each
  low-precision dtype that runs, without a target), held to half an ulp
  (harness/kernel_types/gradients.py's ACCUMULATION_TOLERANCES); the widest row under it too.
- Determinism: one case called three times on identical inputs.

The Triton interpreter pays a few milliseconds per program, so a row costs a CPU judgement what a
thousand cost a GPU's. On the CPU the backward's cases are chosen to cost about what they find:
one row count past both SM counts (133) and one ragged past twice them (269, the accumulation
stage's), 256 rows for a sum (where a low-precision accumulator is already an ulp off, in every
way of splitting the rows a kernel might take: one program, four, one per SM), and each forward
sweep shape once, in one of its dtypes by turn (the forward judged each in every dtype; the
backward's dtype paths are judged by its values, layouts and accumulation). On a GPU, all of it:
every count past the SM counts, sums over 16384 rows, every sweep shape in every dtype.

Seeds: each case its own, apart from every forward stage's (harness/correctness/cases.py) and the
upstream gradient's offset (harness/kernel_types/gradients.py).
"""
from __future__ import annotations

import math

from harness.correctness.cases import Capabilities
from harness.kernel_types import registry
from harness.kernel_types.registry import Case

SM_COUNTS = (108, 132)  # A100; H100 and H200
# past each SM count, ragged past twice each, and past four times the larger
GPU_PAST_SMS = (109, 133, 2 * 108 + 1, 2 * 132 + 5, 4 * 132 + 7)
CPU_PAST_SMS = (133,)  # past both; 269 (ragged past twice both) is the CPU's accumulation shape
ACCUMULATION_ROWS = {"cpu": 2 * 132 + 5, "cuda": 16384}
# attention's weight-like sums run over the sequence, whose cost grows with its square
FOUR_D = {"B": 2, "H": 3, "S": 5}  # leading dims of the row types' four-dimensional case
DETERMINISM_ROWS = {"cpu": 21, "cuda": 4 * 132 + 7}
ATTENTION_DETERMINISM_SEQUENCE = 97  # several query and key blocks of 16 to 64, one ragged
VALUE_ROWS = 4  # the values and layouts cases: a few rows of the smoke shape's width
SEED = 60_000

# per type: the dim a backward's grid covers (rows, or heads for attention and rotary) and the other
# dims kept narrow in the cases that only need many rows
ROWS_DIM = {"softmax": "M", "layernorm": "M", "rmsnorm": "M", "reduce": "M", "cross_entropy": "N", "matmul": "M",
            "fused_mlp": "M", "flash_attention": "H", "rotary_embedding": "H",
            # chains (harness/kernel_types/types/chains.py)
            "add_rmsnorm": "M", "silu_mul": "M", "rotary_qk": "HQ", "linear_cross_entropy": "N"}
NARROW = {"softmax": {"N": 24}, "layernorm": {"N": 24}, "rmsnorm": {"N": 24}, "reduce": {"N": 24},
          "cross_entropy": {"V": 24}, "matmul": {"K": 16, "N": 24}, "fused_mlp": {"D": 16, "F": 24},
          "flash_attention": {"B": 1, "S": 16, "D": 16}, "rotary_embedding": {"B": 1, "S": 3, "D": 16},
          "add_rmsnorm": {"N": 24}, "silu_mul": {"N": 24}, "rotary_qk": {"B": 1, "HK": 1, "S": 3, "D": 16},
          "linear_cross_entropy": {"D": 16, "V": 24}}
FOUR_D_TYPES = ("softmax", "layernorm", "rmsnorm", "reduce", "add_rmsnorm", "silu_mul")
SCALAR_LOSSES = ("cross_entropy", "linear_cross_entropy")
NORMS = ("layernorm", "rmsnorm")
LAYOUTS = ("bwd:grad_transposed", "bwd:grad_broadcast")


def _seeded(cases: list[Case], offset: int) -> list[Case]:
    return [c.replace(seed=SEED + offset + i) for i, c in enumerate(cases)]


def narrow(kernel_type: str, rows: int, dtype: str, variant: str = "plain", **changes: int) -> Case:
    """A case of `rows` rows (the type's ROWS_DIM), its other dims narrow, in the smoke shape's order."""
    kt = registry.get(kernel_type)
    dims = {k: NARROW[kernel_type].get(k, v) for k, v in kt.smoke_shape.items()}
    dims.update({ROWS_DIM[kernel_type]: rows}, **changes)
    return Case.make(kernel_type, dims, dtype, variant=variant)


def by_turn(forward: list[Case], caps: Capabilities, drop_most_rows: bool = False) -> list[Case]:
    """A forward stage's cases for the backward: on a GPU all of them; on the CPU each shape (and
    variant) once, its dtype by turn among those that run, the target's own case always in its
    dtype. `drop_most_rows`: the case with the most rows is left to the backward's own count past
    the SM counts, which has more (the sweep's 130 rows: the same question, 130 programs dearer)."""
    if caps.device != "cpu" or not forward:
        return list(forward)
    dtypes = caps.dtypes(forward[0].kernel_type)
    own = [c for c in forward if not _target(c)]
    most = max(own, key=_rows) if drop_most_rows and own else None
    chosen, seen = [], []
    for case in forward:
        shape = (case.shape, case.kwargs, case.variant)
        if _target(case):
            chosen.append(case)
        elif shape not in seen and (most is None or case.shape != most.shape or _rows(most) >= CPU_PAST_SMS[0]):
            seen.append(shape)
            chosen.append(case.replace(dtype=dtypes[(len(seen) - 1) % len(dtypes)]))
    return chosen


def _target(case: Case) -> bool:
    """The target's own sweep case (harness/correctness/cases.py seeds it last): kept in its dtype."""
    return case.seed % 1000 == 999


def same_problem(a: Case, b: Case) -> bool:
    """Two cases that ask the same question (seeds apart)."""
    return (a.shape, a.dtype, a.variant, a.kwargs) == (b.shape, b.dtype, b.variant, b.kwargs)


def _rows(case: Case) -> int:
    rows = ROWS_DIM.get(case.kernel_type)
    return case.dims.get(rows, 1) if rows else 1


def shapes(kernel_type: str, caps: Capabilities, timing: Case | None) -> list[Case]:
    """Rows past the SM counts, four leading dims, and the timing shape itself."""
    past = CPU_PAST_SMS if caps.device == "cpu" else GPU_PAST_SMS
    dtypes = [d for d in ("float32", "float16", "bfloat16") if caps.runs(kernel_type, d)]
    found = [narrow(kernel_type, rows, dtypes[i % len(dtypes)]) for i, rows in enumerate(past)]
    if kernel_type in FOUR_D_TYPES:
        found.append(Case.make(kernel_type, {**FOUR_D, "N": NARROW[kernel_type]["N"]}, "float32"))
    found = _seeded(found, 0)
    if timing is not None:  # it is timed anyway: one more call, checked
        found.append(timing)
    return found


def _few_rows(kernel_type: str, dtype: str, variant: str) -> Case:
    """The smoke shape with VALUE_ROWS rows (attention and rotary: as it is)."""
    kt = registry.get(kernel_type)
    dims = dict(kt.smoke_shape)
    if ROWS_DIM[kernel_type] in ("M", "N") and kernel_type not in ("matmul", "fused_mlp"):
        dims[ROWS_DIM[kernel_type]] = VALUE_ROWS
    return Case.make(kernel_type, dims, dtype, variant=variant)


def values(kernel_type: str, caps: Capabilities) -> list[Case]:
    """The values and gradients a training step gives."""
    low = "bfloat16" if caps.runs(kernel_type, "bfloat16") else None  # fp16 cannot hold 1e-8: no stand-in
    wanted = [("bwd:grad_ones", "float32"), ("bwd:grad_scale:1e-08", "float32"), ("bwd:grad_scale:1e-08", low),
              ("bwd:grad_scale:10000.0", "float32"), ("bwd:grad_scale:10000.0", low)]
    if kernel_type in NORMS:
        wanted += [("bwd:weight_zeros", "float32"), ("bwd:weight_zeros", "float16")]
    if kernel_type == "cross_entropy":
        wanted += [("bwd:ignore_index", "float32"), ("bwd:ignore_index", "float16")]
    return _seeded([_few_rows(kernel_type, dtype, v) for v, dtype in wanted if dtype], 100)


def layouts(kernel_type: str) -> list[Case]:
    """grad_out column-major and broadcast, where the output has the dims for it."""
    if kernel_type in SCALAR_LOSSES:  # a scalar loss: its gradient has no layout
        return []
    cases = [_few_rows(kernel_type, "float32", v) for v in LAYOUTS]
    if kernel_type == "reduce":  # a row of sums: broadcast only
        cases = cases[1:]
    return _seeded(cases, 200)


def accumulation(kernel_type: str, caps: Capabilities, sweep: list[Case], judged_dtype: str | None) -> list[Case]:
    """Weight gradients over many rows (types with one) and the sweep's largest shape, under a
    correlated gradient, in every dtype the target serves; without a target, in every
    low-precision dtype that runs (fp32's sums are the sweep's), the many rows on the CPU in the
    narrowest of them only: 269 rows find a sum kept in bf16 whatever the split, while an fp16 sum
    is still within an ulp in some splits there (a GPU's 16384 rows, or an fp16 target, judge it)."""
    kt = registry.get(kernel_type)
    dtypes = (judged_dtype,) if judged_dtype else tuple(d for d in caps.dtypes(kernel_type) if d != "float32")
    many = dtypes if judged_dtype or caps.device != "cpu" else dtypes[-1:]
    widest = max(sweep, key=lambda c: math.prod(c.dims.values()))
    cases = []
    for dtype in dtypes:
        if kt.summed_grads and dtype in many:
            cases.append(narrow(kernel_type, ACCUMULATION_ROWS.get(caps.device, ACCUMULATION_ROWS["cuda"]), dtype,
                                "bwd:grad_correlated"))
        cases.append(widest.replace(dtype=dtype, variant="bwd:grad_correlated"))
    return _seeded(cases, 300)


def determinism(kernel_type: str, caps: Capabilities) -> Case:
    """Enough rows for several programs or blocks, so that the order of a sum can matter (for
    attention: a sequence of several query and key blocks in one head, whose dq sums across them)."""
    rows = DETERMINISM_ROWS.get(caps.device, DETERMINISM_ROWS["cuda"])
    if kernel_type == "flash_attention":
        return _seeded([narrow(kernel_type, 1, "float32", S=ATTENTION_DETERMINISM_SEQUENCE)], 400)[0]
    return _seeded([narrow(kernel_type, rows, "float32")], 400)[0]
