"""What a GPU would run, read from Triton's own IR for the target: constructs the interpreter runs
right and a GPU runs wrong (or not at all), refused by name.

The interpreter runs a launch's programs one after another and computes with numpy, so three kinds
of kernel are right there and wrong on a GPU, whatever values the judge feeds them:
- a `tl.dot` whose accumulator is fp16 or bf16 (`out_dtype=tl.float16`): tensor cores then keep
  the running sum in 16 bits, and at a long K its rounding grows past any fp16 budget, while the
  interpreter's numpy sums in wider precision and rounds once;
- an atomic with `sem="relaxed"` or `scope="cta"`: used as a ticket or a flag between programs, a
  relaxed atomic orders nothing (the partial sums another program wrote before taking its ticket
  may not be visible yet), and a CTA-scoped one is atomic only among the threads of one program.
  Programs that run one after another cannot show either;
- a tensor descriptor made in the kernel (`tl.make_tensor_descriptor`), or anything else that
  needs global scratch memory: Triton allocates that at launch through `triton.set_allocator`,
  which a kernel file may not call, so the launch fails on a GPU ("Kernel requires a runtime
  memory allocation"). A host-side `TensorDescriptor.from_tensor` needs none.

Every specialization a candidate launches is compiled (the first call's) or lowered (later ones)
for the target (harness/compiling/target_compile.py), and its TTIR text goes through `problems`:
one pass of a few regular expressions over text the compiler produced anyway.
"""
from __future__ import annotations

import re

# `%r = tt.dot %a, %b, %c, ... : tensor<16x16xf16> * tensor<16x16xf16> -> tensor<16x16xf16>`
_DOT = re.compile(r"\btt\.dot(?:_scaled)?\b[^\n]*?:\s*tensor<(?:[0-9?]+x)+(\w+)[^\n]*?->\s*tensor<(?:[0-9?]+x)+(\w+)")
# `tt.atomic_rmw add, relaxed, gpu, ...` and `tt.atomic_cas relaxed, gpu, ...`
_ATOMIC = re.compile(r"\btt\.(atomic_rmw)\s+(\w+),\s*(\w+),\s*(\w+)|\btt\.(atomic_cas)\s+(\w+),\s*(\w+)")
_DEVICE_DESCRIPTOR = re.compile(r"\btt\.make_tensor_descriptor\b")
_LOC = re.compile(r"loc\(#(\w+)\)\s*$")
_LOC_DEF = re.compile(r'^#(\w+) = loc\("([^"]*)":(\d+):\d+\)', re.M)
_LOC_NAMED = re.compile(r'^#(\w+) = loc\("[^"]*"\(#(\w+)\)\)', re.M)  # `#loc16 = loc("acc"(#loc1))`
_WIDE_ACCUMULATORS = {"f32", "f64", "i32", "i64"}


def _where(text: str, line: str) -> str:
    """' (file.py:LINE)' for an IR line whose location the module names; '' otherwise."""
    match = _LOC.search(line)
    if not match:
        return ""
    places = {name: (path, lineno) for name, path, lineno in _LOC_DEF.findall(text)}
    named = dict(_LOC_NAMED.findall(text))
    name = match.group(1)
    for _ in range(8):  # a named location points at another, which points at a file and line
        if name in places:
            path, lineno = places[name]
            return f" ({path.rsplit('/', 1)[-1]}:{lineno})"
        if name not in named:
            return ""
        name = named[name]
    return ""


def problems(ttir: str, label: str, global_scratch_bytes: int = 0) -> list[str]:
    """Why the kernel `label`, as the target compiles it, would compute wrong or fail to launch on a
    GPU while the interpreter runs it right: one sentence per construct, empty when none."""
    found: list[str] = []
    for line in ttir.splitlines():
        dot = _DOT.search(line)
        if dot and dot.group(2) not in _WIDE_ACCUMULATORS:
            found.append(
                f"{label}: a tl.dot of {dot.group(1)} operands accumulates in {dot.group(2)}{_where(ttir, line)}: "
                f"on a GPU its running sum is kept in {dot.group(2)} and loses bits with every K block (the "
                "interpreter sums wider and hides it); accumulate in fp32 (out_dtype=tl.float32, or int32 for "
                "int8) and cast once at the store")
        atomic = _ATOMIC.search(line)
        if atomic:
            op, sem, scope = ((atomic.group(2), atomic.group(3), atomic.group(4)) if atomic.group(1)
                              else ("cas", atomic.group(6), atomic.group(7)))
            if sem == "relaxed" or scope == "cta":
                what = 'sem="relaxed"' if sem == "relaxed" else 'scope="cta"'
                why = ("orders nothing: what another program wrote before its atomic may not be visible after "
                       "yours" if sem == "relaxed" else "is atomic only among the threads of one program")
                found.append(
                    f"{label}: an atomic {op} with {what}{_where(ttir, line)}: on a GPU it {why}, while the "
                    "interpreter runs programs one after another and cannot show it; use the default "
                    '(sem="acq_rel", scope="gpu") or pass results between programs through a second launch')
        if _DEVICE_DESCRIPTOR.search(line):
            found.append(
                f"{label}: a tensor descriptor made inside the kernel (tl.make_tensor_descriptor)"
                f"{_where(ttir, line)} needs global scratch memory, which Triton allocates at launch only through "
                "triton.set_allocator, not a kernel's to call: the launch fails on a GPU; pass a host-side "
                "TensorDescriptor.from_tensor(...) as an argument instead")
    if global_scratch_bytes > 0 and not any("tl.make_tensor_descriptor" in p for p in found):
        found.append(
            f"{label}: needs {global_scratch_bytes} B of global scratch memory per launch, which Triton allocates "
            "only through triton.set_allocator, not a kernel's to call: the launch fails on a GPU")
    return list(dict.fromkeys(found))
