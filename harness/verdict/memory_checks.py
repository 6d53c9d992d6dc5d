"""The judging process's recheck of a checked call's memory and of how its inputs were passed.

The worker placed every input in a guarded buffer and recorded, after the call, the sha256 of each
whole buffer, where any byte changed, and whether kernel_fn stored past anything it allocated
(harness/correctness/guards.py); it called kernel_fn with the inputs as a model passes them, in
the grad mode the case's seed chooses (harness/correctness/as_passed.py). Nothing of that is
taken on the worker's word here: this process rebuilds the same buffers from the case's seed,
holds every recorded digest to the digest of the buffer it built (a call that changed nothing
leaves it), and holds the recorded mode to the one it computes. The worker's record of where a
byte changed only gives the failure its offset.
"""
from __future__ import annotations

from harness.correctness import as_passed, guards
from harness.kernel_types import registry
from harness.kernel_types.registry import Case


def names(case: Case, args: list) -> list[str]:
    return list(registry.get(case.kernel_type).params[:len(args)])


def expected(case: Case, args: list) -> list:
    """The digests of the buffers the worker built for `case` (args: its inputs, on the CPU)."""
    return guards.expected_digests(args, case.seed, names(case, args))


def refilled(first: Case, second: Case) -> list:
    """The digests of `first`'s buffers after the replay check refilled them with `second`'s values."""
    args, _ = registry.build_inputs(first, "cpu")
    placed = guards.place(args, first.seed, names(first, args))
    for dst, src in zip(placed.args, registry.build_inputs(second, "cpu")[0]):
        if hasattr(dst, "copy_"):
            dst.copy_(src)
    return placed.digests()


def call_problem(rec: dict, case: Case, args: list, want: list | None = None,
                 mode_of: Case | None = None) -> str | None:
    """Why one checked call's record fails the memory and input rules, or None. `want`: the
    digests its buffers must have (`expected` by default); `mode_of`: the case whose seed chose
    the call's mode (the replay's second call is made on the first's inputs, in the first's mode)."""
    label, obs = case.label(), rec.get("obs") or {}
    mode = as_passed.mode_for((mode_of or case).seed)
    if rec.get("passed_as") != mode:
        # a call made some other way than planned: what it proves is not what the judge asked
        return f"{label}: the worker did not call kernel_fn {as_passed.WORDS[mode]} as the judge planned"
    digests = obs.get("digests")
    if not isinstance(digests, list) or "strays" not in obs:
        # unguarded: a store past a row or past the output would go unseen
        return f"{label}: the worker recorded no guard of the call's buffers"
    want = want if want is not None else expected(case, args)
    writes = {w.get("input"): w for w in obs.get("writes") or ()}
    for i, (got, ref) in enumerate(zip(digests, want)):
        if got == ref:
            continue
        name = names(case, args)[i] if i < len(args) else f"input {i}"
        how = as_passed.describe(case.kernel_type, name, mode)
        if i in writes:
            # in place, or past a row into the wider buffer a view lives in, or into a guard
            return guards.describe_write(label, writes[i], how)
        return (f"{label}: the buffer of input {name} ({how}) is not the one the judge built after the call "
                "(its sha256 differs): kernel_fn wrote into it")
    if len(digests) != len(want):
        return f"{label}: the worker recorded {len(digests)} input digests, the call had {len(want)}"
    if obs["strays"]:
        # past the output or past scratch kernel_fn allocated: on a GPU, another tensor's memory
        return guards.describe_stray(label, obs["strays"][0])
    return None
