"""Chains of no registry type: any run of memory-bound operators whose intermediates stay inside it.

The four typed patterns (autokernel.profile.chains) are served by typed kernels. Every other run
the graph holds is found here, generically, by a rule rather than a pattern:

- its ops are FUSIBLE: element-wise maths, reductions and normalisations, whose time is the bytes
  they move, so that one kernel reading the run's inputs once and writing its result once saves
  the intermediates' round trips. Products (mm, bmm, convolutions), attention and embeddings are
  not: their time is FLOPs or gathers, they have targets of their own, and a module target is the
  place to fuse them with their neighbours. Nor are ops whose result a replay cannot reproduce
  (dropout's random draw), that only move data (cat, index), or in-place variants (add_: a
  replay would write into its inputs);
- every value an op of the run writes is read only by ops of the run, except the last op's
  output, which is what the run gives back (read outside it or returned to the caller). A run is
  so a chain of "read only by the next" links, widened to a tree where a value feeds two ops of
  the same run (tanh-GELU reads x in three places, all inside the run);
- it holds at least two ops, none of them already in a typed chain.

Found by walking the ops backwards: an op joins the run of its readers when all of them are in
one run. An op whose output is read by a run and also elsewhere (a residual sum read by the
LayerNorm and by the next residual add, a value the caller gets) does not join: that is listed
under `rejected`, naming the other reader, as the typed patterns' near-misses are.
"""
from __future__ import annotations

from autokernel.profile.chain_graph import OUTPUT, OpGraph
from autokernel.profile import chains
from autokernel.profile.chains import Chain, Rejected

CHAIN_TYPE = "generic"
# What serving does with a generic chain's winner, in its plan row and in verify's and export's tally:
# a module winner replaces a module's forward, called with the module's arguments; a chain is a run
# of ops inside one forward or across several, called with the chain's inputs, and no form finds it.
NOT_BOUND = ("not served: a generic chain's winner replaces a run of operators, not a module's forward, "
             "and no form binds such a run in a model yet; it is judged and kept, not bound")

ELEMENTWISE = {
    "add", "sub", "rsub", "mul", "div", "neg", "pow", "rsqrt", "sqrt", "exp", "exp2", "expm1", "log", "log1p",
    "log2", "tanh", "sigmoid", "silu", "gelu", "relu", "leaky_relu", "elu", "selu", "celu", "mish", "softplus",
    "hardtanh", "hardswish", "hardsigmoid", "erf", "abs", "sign", "reciprocal", "sin", "cos", "clamp",
    "clamp_min", "clamp_max", "maximum", "minimum", "where", "masked_fill", "floor", "ceil", "round", "square",
    "addcmul", "addcdiv", "lerp", "threshold",
}
REDUCTIONS = {"sum", "mean", "var", "var_mean", "std", "std_mean", "amax", "amin", "linalg_vector_norm", "norm",
              "logsumexp", "_softmax", "_log_softmax"}
NORMALISATIONS = {"native_layer_norm", "native_group_norm", "_native_batch_norm_legit_no_training", "_fused_rms_norm"}
FUSIBLE = {f"aten::{n}" for n in ELEMENTWISE | REDUCTIONS | NORMALISATIONS}
FLOATING = ("float32", "float16", "bfloat16", "float64")


def find(graph: OpGraph, claimed: set[int]) -> tuple[list[Chain], list[Rejected]]:
    """The generic chains of `graph` outside the typed chains' ops (`claimed`), in op order, and
    the runs an op was kept out of because its output has another reader."""
    run_of: dict[int, int] = {}  # op index -> the index of its run's last op
    rejected: list[Rejected] = []
    for op in reversed(graph.ops):
        if op.name not in FUSIBLE or op.index in claimed:
            continue
        run_of[op.index] = op.index
        readers = list(dict.fromkeys(u for v in op.outputs for u in graph.users(v)))
        runs = {run_of.get(u) for u in readers}  # None: a reader outside every run, or the caller
        if len(runs) == 1 and None not in runs:
            run_of[op.index] = runs.pop()
        elif runs - {None}:  # the run of its first reader in one is the run it misses
            missed = next(run_of[u] for u in sorted(u for u in readers if run_of.get(u) is not None))
            others = [u for u in readers if run_of.get(u) != missed]
            joined = sorted(i for i, last in run_of.items() if last == missed and i != op.index)
            where = " and ".join(_where(graph, u) for u in others)
            rejected.append(Rejected(CHAIN_TYPE, [op.index] + joined,
                                     f"{op.name} (op {op.index})'s output is read by {where} as well: fusing "
                                     "would drop a value the model uses elsewhere, so it is left unfused"))
    members: dict[int, list[int]] = {}
    for i, last in run_of.items():
        members.setdefault(last, []).append(i)
    found = [_chain(graph, sorted(ops)) for ops in members.values() if len(ops) >= 2]
    found = [c for c in found if c.outputs]
    return sorted(found, key=lambda c: c.ops[0]), rejected


def find_all(graph: OpGraph) -> tuple[list[Chain], list[Rejected]]:
    """The typed chains, then every other run the generic rule finds outside them
    (find, above) and outside any one module's own work, in op order, with
    both kinds' near-misses."""
    typed, rejected = chains.find(graph)
    generic, missed = find(graph, {i for c in typed for i in c.ops})
    # integer runs (position ids, mask arithmetic) are bookkeeping, not the activations a model's
    # memory bandwidth goes to
    generic = [c for c in generic if c.dtype in FLOATING and not within_one_module(graph, c)]
    return sorted(typed + generic, key=lambda c: c.ops[0]), rejected + missed


def within_one_module(graph: OpGraph, chain: Chain) -> bool:
    """A run that is the whole of one submodule's work (an RMSNorm, a tanh-GELU module) is that
    module's own: its row in the plan, of a kernel type or a module target, already stands for the
    same ops, so a generic chain of it would be one target twice. A run inside a larger forward
    (a GELU written inline between two projections) or across modules (a residual add and the
    next norm) is a narrower target than any module's, and is kept."""
    names = {graph.ops[i].module[0] for i in chain.ops}
    if len(names) != 1 or "" in names:
        return False
    (name,) = names
    whole = {op.index for op in graph.ops if op.module[0] == name or op.module[0].startswith(name + ".")}
    return whole == set(chain.ops)


def _chain(graph: OpGraph, ops: list[int]) -> Chain:
    inside = set(ops)
    made = {v for i in ops for v in graph.ops[i].outputs}
    inputs = list(dict.fromkeys(v for i in ops for v in graph.ops[i].inputs if v not in made))
    outputs = [v for v in graph.ops[ops[-1]].outputs if set(graph.users(v)) - inside]
    first = graph.ops[ops[0]]
    return Chain(CHAIN_TYPE, ops, inputs, outputs, {}, first.dtypes[0] if first.dtypes else "float32")


def _where(graph: OpGraph, index: int) -> str:
    if index == OUTPUT:
        return "the caller (it is returned)"
    op = graph.ops[index]
    return f"{op.name} (op {index}{f', in {op.module[0]} ({op.module[1]})' if op.module[0] else ''})"
