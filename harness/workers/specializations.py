"""The judge's worker: every Triton specialization a candidate launches, taken through the compiler
for the target when the stage that first launched it ends (harness/workers/worker.py's `passed`)."""
from __future__ import annotations

from harness.compiling import target_compile
from harness.correctness.launches import MAX_SPECIALIZATIONS


def new_specializations_problem(monitor, arch: str) -> str | None:
    """Every Triton specialization the launch monitor (harness/correctness/launches.py) kept since
    the last look, taken through Triton's compiler for `arch` (target_compile.lower_triton: the
    front end and the GPU passes, a tenth of a second each): why one does not compile, or None. The
    first call's are not the only ones a GPU would compile: a kernel whose later launches take a
    branch only the interpreter accepts would PASS, "compiled for sm_90", and not compile there at
    the shape it is timed at. Each specialization once per judgement (keyed as Triton keys its cache)."""
    if getattr(monitor, "refused", None):  # at a stage's end too: a timed call is not an observed one
        return f"a launch the judge refused, caught by the candidate or not: {monitor.refused}"
    if monitor.overflow:
        return (f"more than {MAX_SPECIALIZATIONS} distinct Triton specializations were launched (argument "
                f"dtypes, alignments, integer classes, constexprs and launch options); the judge compiles each "
                f"for {arch}, and a kernel needs a few per shape: derive constexprs from shapes, not values")
    new = monitor.take_records()
    if not new:
        return None
    try:
        tc = target_compile.lower_triton(new, arch)
    except Exception:  # a fault in our compile-for-target support is not the candidate's
        return None
    return None if tc.ok else f"a specialization first launched here does not compile for {arch}:\n{tc.detail}"
