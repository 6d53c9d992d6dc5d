"""Starter kernels: one honest, judged kernel per kernel type and backend, where every search starts.

Each starter is one self-contained kernel file (see DESIGN.md, "The kernel file"):
`starter_kernels/<backend>/<type>.py`, with `KERNEL_TYPE`, `BACKEND` and `kernel_fn` of the type's
exact signature. It is what the judge times as the baseline of a search, what the LLM is shown
first, and the point the offline tuner explores around.

The tunable-parameter convention
--------------------------------
A starter declares its search space and its current choice as pure literals, readable with
`ast.literal_eval`, each on one line:

    TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3]}
    CONSTRAINTS = ["BLOCK_N >= 32 * num_warps"]   # Python boolean expressions over TUNABLES names
    CONFIG = {"BLOCK_N": 1024, "num_warps": 4, "num_stages": 2}

`kernel_fn` reads the module-level `CONFIG` every time it is called, so the offline tuner makes a
candidate by rewriting only the `CONFIG = {...}` line of a copy of the file; nothing else changes
and the judge sees an ordinary kernel file. Every CONFIG drawn from TUNABLES that satisfies all of
CONSTRAINTS gives correct results (block sizes bound a chunk, they never assume a shape: a row
longer than a block is processed in a loop, ragged edges are masked). Constraints only rule out
configurations that would be slow or would not fit a GPU's registers or shared memory.
`num_warps` and `num_stages` are passed as launch options; the interpreter ignores them.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

SINGLE_TYPES = ("matmul", "softmax", "layernorm", "rmsnorm", "flash_attention", "fused_mlp",
                "cross_entropy", "rotary_embedding", "reduce")
# chains (harness/kernel_types/types/chains.py): Triton starters only
CHAIN_TYPES = ("add_rmsnorm", "silu_mul", "rotary_qk", "linear_cross_entropy")
KERNEL_TYPES = SINGLE_TYPES + CHAIN_TYPES
BACKENDS = ("triton", "cuda")
TYPES_BY_BACKEND = {"triton": KERNEL_TYPES, "cuda": SINGLE_TYPES}


def starter_path(kernel_type: str, backend: str = "triton") -> Path:
    """The file of the starter kernel for `kernel_type` on `backend`, inside the installed package."""
    if kernel_type not in KERNEL_TYPES:
        raise KeyError(f"no starter kernel for kernel type {kernel_type!r}: "
                       f"known types are {', '.join(KERNEL_TYPES)}")
    if backend not in BACKENDS:
        raise KeyError(f"no starter kernels for backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if kernel_type not in TYPES_BY_BACKEND[backend]:
        raise KeyError(f"no {backend} starter kernel for the chain type {kernel_type!r}: chains have Triton "
                       "starters only (use backend 'triton')")
    path = Path(str(resources.files(__name__).joinpath(backend, f"{kernel_type}.py")))
    if not path.is_file():
        raise KeyError(f"no {backend} starter kernel for {kernel_type!r} in this installation "
                       f"(looked for {path})")
    return path
