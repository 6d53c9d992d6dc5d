"""torch.compile's caches for the baselines, kept from one judgement to the next.

The torch.compile baseline is PyTorch's own op compiled by Inductor, timed before any candidate is
imported. Compiled cold (Inductor's code generation and a C++ or Triton compile), one op's baseline
costs seconds to tens of seconds per worker, and every worker starts with an empty scratch folder,
Inductor's default cache. Here the compile uses a cache beside the CUDA build cache
($AUTOKERNEL_CACHE_DIR, else ~/.cache/autokernel) instead, so the same op at the same shape is
code-generated once per machine.

It is written only before the sandbox: no candidate can write it afterwards (the sandbox's writable
folders are the judgement's scratch folder and its own compiler caches beneath it), so no candidate
can plant a slow baseline for a later one. Inductor's keys hold the graph, the config and the versions of
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
    from harness.cuda_build import shared_cache_root
    return shared_cache_root().parent / "compile-baseline"


@contextlib.contextmanager
def baseline_caches() -> Iterator[None]:
    """Inside: torch.compile reads and writes the kept caches. A cache that cannot be made (a
    read-only home) leaves the defaults: the baseline is compiled cold, as before."""
    saved = {name: os.environ.get(name) for name in VARIABLES}
    kept = root()
    try:
        for name, sub in VARIABLES.items():
            folder = kept / sub
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(folder)
    except OSError:
        _restore(saved)
        yield
        return
    headers = _kept_headers(kept / "inductor" / "precompiled_headers")
    try:
        yield
    finally:
        _restore(saved)
        headers()


def _kept_headers(folder: Path):
    """Inductor precompiles the C++ headers of its CPU kernels (seconds of g++) into a folder it
    fixes at import from the temporary folder, which for a worker is its scratch, deleted after
    every judgement: point it at the kept cache while the baseline compiles. Where Inductor has
    no such folder (another torch), nothing changes. Returns what puts the folder back."""
    try:
        from torch._inductor import codecache
    except Exception:  # noqa: BLE001 - no Inductor to speak of: torch.compile fails on its own
        return lambda: None
    names = ("_HEADER_DIR", "_HEADER_LOCK_DIR")
    if not all(isinstance(getattr(codecache, name, None), str) for name in names):
        return lambda: None
    saved = {name: getattr(codecache, name) for name in names}
    codecache._HEADER_DIR = str(folder)
    codecache._HEADER_LOCK_DIR = str(folder / "locks")

    def restore() -> None:
        for name, value in saved.items():
            setattr(codecache, name, value)
    return restore


def _restore(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
