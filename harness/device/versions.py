"""What a verdict, a run and a KernelBench result say they were made with: torch, Triton, CUDA and
Python versions."""
from __future__ import annotations

import platform
from typing import Any

import torch

def versions() -> dict[str, Any]:
    # read from the package metadata: importing triton here would fix its interpret mode for this
    # whole process before a later in-process Triton-interpreter run could switch it on
    from importlib import metadata
    try:
        triton_version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton_version = None
    return {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
            "python": platform.python_version()}
