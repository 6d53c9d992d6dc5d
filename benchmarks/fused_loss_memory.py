"""A training step's peak memory with and without the fused final projection + cross-entropy.

A transformers LLaMA built from a config (no weights downloaded), its vocabulary 32000, at
2 x 1024 tokens by default. Eager: logits = lm_head(hidden), then cross-entropy of each position's
logits against the next token. Fused: the same hidden states into the linear_cross_entropy chain's
Triton starter (starter_kernels/triton/linear_cross_entropy.py) served as a custom op with its
backward (autokernel/deploy/routing/ops.py), so the [tokens, vocabulary] logits never exist.

Served: the unmodified model called as a training loop calls it, model(ids, labels=ids).loss,
with the same starter as a linear_cross_entropy winner patched in by autokernel's router (the
causal LM's form, autokernel/deploy/routing/chain_forms.py): what `verify --train` runs.

How peak memory is measured on the CPU (there is no torch.cuda.max_memory_allocated there):
autokernel/deploy/step_memory.py, which verify --train uses too:
- `allocator_peak_bytes`: torch.profiler's memory events (profile_memory=True) record every
  allocation and free of PyTorch's CPU allocator during the step (forward, loss, backward, AdamW
  step); the most held at once above what was held when the step began. What lives before the step
  (weights, AdamW's state after a warm-up step) is `held_before_bytes`, counted from the tensors.
- `rss_rise_bytes`: how far the process's resident-set high-water mark (getrusage ru_maxrss) rose
  during the measured step, in a fresh process per mode. The warm-up step before it has usually
  reached that mark already, so this is not the step's peak: it shows only that the measured step
  needed no memory beyond the warm-up's that PyTorch's allocator does not see (the Triton
  interpreter's numpy copies of kernel arguments).
On a GPU the same step reports torch.cuda.max_memory_allocated beside them.

    python benchmarks/fused_loss_memory.py [--tokens 1024] [--batch 2] [--vocab 32000] [--modes eager,fused,served]
                                           [--json PATH]

Each mode runs in its own process, so one mode's high-water mark never hides the other's.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("eager", "fused", "served")
# On the CPU the Triton interpreter pays per program and per op, not per element: larger blocks
# than a GPU's registers allow make the measurement minutes shorter and change no byte it counts.
CPU_CONFIG = {"BLOCK_M": 128, "BLOCK_V": 256, "BLOCK_K": 64, "BWD_BLOCK_M": 128, "BWD_BLOCK_V": 128,
              "BWD_BLOCK_D": 64}


def build(vocab: int, hidden: int, layers: int, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096)
    return LlamaForCausalLM(config).train()


def _starter():
    path = ROOT / "starter_kernels" / "triton" / "linear_cross_entropy.py"
    spec = importlib.util.spec_from_file_location("linear_cross_entropy_starter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if os.environ.get("TRITON_INTERPRET") == "1":
        module.CONFIG = {**module.CONFIG, **CPU_CONFIG}
    return module


def fused_loss_op():
    from autokernel.deploy.routing import ops
    module = _starter()
    return ops.custom_op("linear_cross_entropy[memory]", "linear_cross_entropy", module.kernel_fn, module.backward_fn)


def served_router(model, ids):
    """The starter as the winner of the model's linear_cross_entropy chain, its range the call's."""
    from autokernel.deploy import routing
    module = _starter()
    dims = {"N": ids.numel(), "D": model.config.hidden_size, "V": model.config.vocab_size}
    dtype = routing.dtype_name(model.lm_head.weight)
    target = f"linear_cross_entropy[{'x'.join(map(str, dims.values()))}:{dtype}]"
    return routing.Router([routing.Winner(target, "linear_cross_entropy", dims, dtype, module.kernel_fn, {}, "module",
                                          [{"name": "", "class": type(model).__name__}],
                                          backward_fn=module.backward_fn)])


def step_loss(model, ids, mode: str, op=None):
    """The next-token loss of `ids`: eager through the logits, fused without them, served by the
    model's own loss with labels (inside the router's patch)."""
    import torch.nn.functional as F
    if mode == "served":
        return model(ids, labels=ids).loss
    if mode == "eager":
        logits = model(ids).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
    hidden = model.model(ids).last_hidden_state
    x = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    return op(x, model.lm_head.weight, ids[:, 1:].reshape(-1), -100, "mean")


def measure(mode: str, batch: int, tokens: int, vocab: int, hidden: int, layers: int, device: str = "cpu") -> dict:
    """One mode's step, measured in this process (run it in a fresh one: see main)."""
    import contextlib

    import torch
    from autokernel.deploy import step_memory
    model = build(vocab, hidden, layers).to(device)
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    op = fused_loss_op() if mode == "fused" else None
    router = served_router(model, ids) if mode == "served" else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = step_loss(model, ids, mode, op)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    with router.patched(model) if router else contextlib.nullcontext():
        first_loss = step()  # the warm-up: AdamW makes its state on its first step
        held = step_memory.held_bytes(step_memory.trained_tensors(model, optimizer))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        second_loss, figures = step_memory.measure_step(step, held, ids.is_cuda)
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    served = router.tally.to_json()["per_kernel"] if router else None
    return {"mode": mode, "batch": batch, "tokens": tokens, "vocab": vocab, "hidden": hidden, "layers": layers,
            **figures, "rss_rise_bytes": max(rss_after - rss_before, 0), "losses": [first_loss, second_loss],
            "logits_bytes": batch * tokens * vocab * 4, "served": served,
            "device": "cuda" if ids.is_cuda else "cpu", "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1"}


def run_all(batch: int, tokens: int, vocab: int, hidden: int, layers: int, device: str = "cpu",
            modes: tuple[str, ...] = ("eager", "fused")) -> dict:
    """Each mode in a fresh process; each other mode's peak against eager's. On the CPU the Triton
    interpreter runs the fused kernel."""
    from autokernel.deploy.step_memory import HOW
    out = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    for mode in ("eager", *[m for m in modes if m != "eager"]):
        done = subprocess.run([sys.executable, __file__, "--one", mode, "--batch", str(batch), "--tokens", str(tokens),
                               "--vocab", str(vocab), "--hidden", str(hidden), "--layers", str(layers),
                               "--device", device],
                              capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"the {mode} step failed:\n{done.stderr[-3000:]}")
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        if mode != "eager":
            out[f"{mode}_over_eager_peak"] = out[mode]["peak_bytes"] / out["eager"]["peak_bytes"]
            out[f"{mode}_over_eager_allocator_peak"] = (out[mode]["allocator_peak_bytes"]
                                                        / out["eager"]["allocator_peak_bytes"])
    out["how"] = HOW + "; rss_rise_bytes: ru_maxrss after the step less before it, a fresh process per mode"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--modes", default="eager,fused,served", help="comma-separated: eager, fused (the op by hand), "
                   "served (the model's own loss with labels, the router's fused loss)")
    p.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(measure(a.one, a.batch, a.tokens, a.vocab, a.hidden, a.layers, a.device)))
        return 0
    modes = tuple(m for m in a.modes.split(",") if m)
    result = run_all(a.batch, a.tokens, a.vocab, a.hidden, a.layers, a.device, modes)
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    for mode in [m for m in MODES if m in result]:
        r = result[mode]
        print(f"{mode:6s}: peak {r['peak_bytes'] / 2**20:8.1f} MiB (held before {r['held_before_bytes'] / 2**20:.1f} MiB "
              f"+ allocator peak {r['allocator_peak_bytes'] / 2**20:.1f} MiB), RSS rise {r['rss_rise_bytes'] / 2**20:.1f} MiB, "
              f"losses {r['losses']}"
              + (f", cuda max_memory_allocated {r['cuda_max_memory_allocated'] / 2**20:.1f} MiB"
                 if r["cuda_max_memory_allocated"] is not None else ""))
        if mode != "eager":
            print(f"{mode} / eager peak: {result[f'{mode}_over_eager_peak']:.3f} "
                  f"(allocator peak alone {result[f'{mode}_over_eager_allocator_peak']:.3f})")
    print(f"logits would be {result['eager']['logits_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
