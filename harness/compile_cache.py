"""torch.compile's caches for the baselines, kept from one judgement to the next.

The torch.compile baseline is PyTorch's own op compiled by Inductor, timed before any candidate is
imported. Compiled cold (Inductor's code generation and a C++ or Triton compile), one op's baseline
costs seconds to tens of seconds per worker, and every worker starts with an empty scratch folder,
Inductor's default cache. Here the compile uses a cache beside the CUDA build cache
($AUTOKERNEL_CACHE_DIR, else ~/.cache/autokernel) instead, so the same op at the same shape is
code-generated once per machine.

It is written only before the sandbox: no candidate can write it afterwards (the sandbox's writable
folders are the scratch folder, Triton's cache and the CUDA build cache), so no candidate can plant
a slow baseline for a later one. Inductor's keys hold the graph, the config and the versions of
torch and the compiler, so a stale entry is never reused.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

# Inductor's own cache, and Triton's for the kernels Inductor writes on a GPU
VARIABLES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def root() -> Path:
    from harness.cuda_build import cache_root
    return cache_root().parent / "compile-baseline"


@contextlib.contextmanager
def baseline_caches() -> Iterator[None]:
    """Inside: torch.compile reads and writes the kept caches. A cache that cannot be made (a
    read-only home) leaves the defaults: the baseline is compiled cold, as before."""
    saved = {name: os.environ.get(name) for name in VARIABLES}
    try:
        for name, sub in VARIABLES.items():
            folder = root() / sub
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(folder)
    except OSError:
        _restore(saved)
        yield
        return
    try:
        yield
    finally:
        _restore(saved)


def _restore(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
