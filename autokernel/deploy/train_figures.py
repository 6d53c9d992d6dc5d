"""verify --train's figures: throughput and peak memory of the fine-tuning run, eager and with the
winners, against torch.compile of both and against Liger Kernel.

Each run's step time is the median of its steps after the first (the first makes the optimizer's
state and, compiled, compiles). Throughput is tokens/s when the model's first input is token ids
(integers), else steps/s. Peak memory is torch.cuda.max_memory_allocated over the steps, on a GPU
only. On the CPU every time is a CPU wall-clock figure with the winners in the Triton interpreter:
it says nothing of a GPU, and the result says so.

torch.compile is timed when verify times it (`--compile`; default on a GPU). Liger Kernel is timed
where it is installed, the model holds a transformers model of a type it patches, and there is a
GPU (its kernels are Triton kernels written for one); otherwise the figures say why not.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import statistics
from typing import Any, Callable, Optional

CPU_NOTE = ("CPU wall clock, the winners in the Triton interpreter (numpy, one program at a time): "
            "these figures say nothing about a GPU; peak memory is measured on a GPU only")


def throughput(loaded: Any, winners: list, steps: int, eager: Any, patched: Any, compile_baseline: bool,
               log: Callable[[str], None]) -> dict:
    """Per run (eager, patched, compile, patched_compile, liger): step ms, tokens/s or steps/s,
    peak memory; or why the run was not timed."""
    from autokernel.deploy.fine_tune import fine_tune
    unit, per_step = _unit(loaded)
    on_gpu = loaded.spec.device.startswith("cuda")
    runs = {"eager": _figures(eager, per_step), "patched": _figures(patched, per_step)}
    if compile_baseline:
        log("verify --train: timing torch.compile of the model, unmodified and patched")
        for name, chosen in (("compile", None), ("patched_compile", winners)):
            try:
                runs[name] = _figures(fine_tune(loaded, chosen, steps, compiled=True), per_step)
            except Exception as e:  # noqa: BLE001 (a model torch.compile cannot take: say so, keep the rest)
                runs[name] = {"skipped": f"torch.compile raised {type(e).__name__}: {str(e).strip()[:200]}"}
    else:
        why = "not timed: torch.compile is timed on a GPU by default (--compile times it here)"
        runs["compile"] = runs["patched_compile"] = {"skipped": why}
    runs["liger"] = liger(loaded, steps, per_step, on_gpu, log)
    base = runs["eager"].get("step_ms")
    for figures in runs.values():
        if figures.get("step_ms") and base:
            figures["speedup_vs_eager"] = base / figures["step_ms"]
    return {"unit": unit, "per_step": per_step, "runs": runs, "representative_of_gpu": on_gpu,
            **({} if on_gpu else {"note": CPU_NOTE})}


def memory(eager: Any, patched: Any) -> dict:
    """verify.json's `train.memory`: the second step's peak memory, eager and with the winners
    (step_memory.py says how it is measured), or why there is none."""
    from autokernel.deploy.step_memory import compared
    if patched.error or eager.step_memory is None or patched.step_memory is None:
        return {"skipped": f"the run raised {patched.error}" if patched.error else "not measured"}
    return compared(eager.step_memory, patched.step_memory)


def _unit(loaded: Any) -> tuple[str, int]:
    """('tokens/s', tokens per step) when the first input is token ids, else ('steps/s', 1)."""
    import torch
    first = loaded.make_inputs(0)
    ids = first[0] if first and isinstance(first[0], torch.Tensor) else None
    if ids is not None and not ids.is_floating_point() and not ids.is_complex():
        return "tokens/s", ids.numel()
    return "steps/s", 1


def _figures(run: Any, per_step: int) -> dict:
    if run.error:
        return {"skipped": f"the run raised {run.error}"}
    timed = run.step_s[1:] or run.step_s
    step_s = statistics.median(timed)
    return {"step_ms": step_s * 1e3, "per_s": per_step / step_s if step_s > 0 else None, "steps_timed": len(timed),
            "peak_memory_mb": run.peak_bytes / 2**20 if run.peak_bytes is not None else None}


def liger(loaded: Any, steps: int, per_step: int, on_gpu: bool, log: Callable[[str], None]) -> dict:
    """Liger Kernel's figures on a copy of the model, or why there are none."""
    if importlib.util.find_spec("liger_kernel") is None:
        return {"skipped": "Liger Kernel is not installed (pip install liger-kernel)"}
    hf = _transformers_model(loaded.model)
    if hf is None:
        return {"skipped": "the model holds no transformers model, which is what Liger Kernel patches"}
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance
    except ImportError as e:
        return {"skipped": f"this Liger Kernel has no instance patching: {e}"}
    model_type = getattr(hf.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return {"skipped": f"Liger Kernel does not patch transformers model type {model_type!r}"}
    if not on_gpu:
        return {"skipped": "Liger Kernel's kernels run on a GPU"}
    from autokernel.deploy.fine_tune import fine_tune
    log(f"verify --train: timing Liger Kernel's {model_type} patch on a copy of the model")
    original = loaded.model
    # Liger patches the copy's modules and the modeling module's functions for good: it runs last
    loaded.model = copy.deepcopy(original)
    try:
        _apply_liger_kernel_to_instance(model=_transformers_model(loaded.model))
        return _figures(fine_tune(loaded, None, steps, catch=True), per_step)
    finally:
        loaded.model = original


def _transformers_model(model: Any) -> Optional[Any]:
    """The model itself or its first submodule that is a transformers model (it has a config with
    a model_type)."""
    with contextlib.suppress(AttributeError):
        for m in model.modules():
            if getattr(getattr(m, "config", None), "model_type", None):
                return m
    return None
