"""What `patch(model)` costs: a patched forward where no winner matches, against eager; and the cost
of a served call beside its kernel (the guard and the dispatch).

    python benchmarks/patch_overhead.py [--rounds 15] [--forwards 20]
    python benchmarks/patch_overhead.py --exported 3   # through an exported package, guards on and off

The model is LlamaTiny(2048, 64, 4, 4, 128) from examples/llama_tiny.py at 8 tokens on the CPU,
under torch.no_grad. The winners are those a profile of it records, on every route: rmsnorm
(module: RMSNorm), fused_mlp (module: MLP), rotary_embedding (pattern: apply_rotary_pos_emb in
Attention), flash_attention (op: F.scaled_dot_product_attention in Attention) and matmul (op: every
nn.Linear). Two measurements:

1. Nothing matches: the winners are at 16 tokens, the model runs 8, so every stand-in checks every
   call and falls back (their kernels raise if ever called). Target: at most 5% over eager.
2. Served: winners at the model's dims whose kernel_fn returns a tensor made beforehand, so what is
   timed is the stand-in (guard, argument plumbing, counting) and not a kernel; reported per call,
   as the call through the patched model minus the same kernel_fn called directly (through an
   nn.Module's call for the module routes, since eager pays that too).

Times are this thread's CPU time (one torch thread: a busy machine cannot inflate it), the
variants interleaved in rounds (a machine that gets busier shifts all alike), medians reported.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from autokernel.deploy import routing  # noqa: E402

TARGET_PCT = 5.0
ARGS = (2048, 64, 4, 4, 128)  # vocab, dim, layers, heads, ffn: head dim 16
TOKENS = 8


def llama():
    spec = importlib.util.spec_from_file_location("llama_tiny_bench", ROOT / "examples" / "llama_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module, module.LlamaTiny(*ARGS).eval(), torch.randint(0, ARGS[0], (1, TOKENS))


def winners(tokens: int, kernel_for) -> list:
    """The model's winners at `tokens` tokens, as a profile of it records their routes."""
    _, dim, _, heads, ffn = ARGS
    head = dim // heads
    bhsd = {"B": 1, "H": heads, "S": tokens, "D": head}
    linears = [{"name": "", "class": "Linear"}]  # no name matches: every nn.Linear, by class
    specs = [("rmsnorm", {"M": tokens, "N": dim}, {}, "module", [{"name": "", "class": "RMSNorm"}]),
             ("fused_mlp", {"M": tokens, "D": dim, "F": ffn}, {}, "module", [{"name": "", "class": "MLP"}]),
             ("rotary_embedding", bhsd, {}, "pattern", [{"name": "", "class": "Attention"}]),
             ("flash_attention", bhsd, {"causal": True}, "op", [{"name": "", "class": "Attention"}]),
             ("matmul", {"M": tokens, "K": dim, "N": dim}, {}, "op", linears),
             ("matmul", {"M": tokens, "K": dim, "N": ffn}, {}, "op", linears),
             ("matmul", {"M": tokens, "K": ffn, "N": dim}, {}, "op", linears),
             ("matmul", {"M": tokens, "K": dim, "N": ARGS[0]}, {}, "op", linears)]
    found = []
    for kernel_type, dims, kwargs, route, modules in specs:
        target = routing.label(kernel_type, dims, "float32", kwargs.get("causal"))
        found.append(routing.Winner(target, kernel_type, dims, "float32", kernel_for(kernel_type, dims),
                                    kwargs, route, modules))
    return found


def never(kernel_type, dims):
    def kernel_fn(*args, **kwargs):
        raise AssertionError(f"{kernel_type} was served a call it does not match")
    return kernel_fn


def made_beforehand(kernel_type, dims):
    """A kernel_fn that returns a tensor of the right shape made once: no kernel cost at all."""
    d = dims
    shape = {"matmul": (d.get("M"), d.get("N")), "rmsnorm": (d.get("M"), d.get("N")),
             "fused_mlp": (d.get("M"), d.get("D"))}.get(kernel_type) or tuple(d[k] for k in "BHSD")
    out = torch.zeros(shape)

    def kernel_fn(*args, **kwargs):
        return out
    return kernel_fn


def cpu_us(fn, n: int) -> float:
    start = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - start) / n * 1e6


def interleaved(variants: dict, rounds: int, n: int) -> dict:
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(cpu_us(fn, n))
    return {name: statistics.median(s) for name, s in samples.items()}


def nothing_matches(rounds: int, forwards: int) -> None:
    """Two copies of the model (two imports of its file, same weights): one patched for the whole
    measurement, one not, timed in alternating blocks, so entering the patch and the first forward
    (which binds the forms: reported apart) stay out of the figure. The eager copy's calls of a
    replaced torch function (F.scaled_dot_product_attention) pass through its stand-in, whose first
    check sends them to the original: that cost is counted against eager, not patched."""
    _, eager_model, tokens = llama()
    _, patched_model, _ = llama()
    router = routing.Router(winners(2 * TOKENS, never))
    eager, patched = [], []
    with router.patched(patched_model):
        first = cpu_us(lambda: patched_model(tokens), 1)
        eager_model(tokens)
        for i in range(rounds):
            order = [(eager, eager_model), (patched, patched_model)]
            for samples, model in (order if i % 2 else order[::-1]):
                samples.append(cpu_us(lambda: model(tokens), forwards))
    tally = router.tally.to_json()
    served = sum(k["calls_served"] for k in tally["per_kernel"].values())
    checked = sum(o["fell_back"] for o in tally["per_op"].values()) // (rounds * forwards + 1)
    e, p = statistics.median(eager), statistics.median(patched)
    print(f"nothing matches: eager {e:8.1f} us, patched {p:8.1f} us per forward (thread CPU time, median of "
          f"{rounds} alternating blocks of {forwards} forwards)")
    print(f"  overhead {100 * (p - e) / e:+.1f}% (target at most {TARGET_PCT:.0f}%); {checked} calls per forward "
          f"checked and fallen back, {served} served")
    print(f"  the first forward after entering the patch binds the forms: {first:.0f} us")


class Direct(torch.nn.Module):
    """kernel_fn called through a module, as the patched module's call is: same __call__ cost."""

    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self):
        return self.call()


def served_calls(rounds: int, n: int) -> None:
    module, model, tokens = llama()
    router = routing.Router(winners(TOKENS, made_beforehand))
    by_type = {w.kernel_type: w for w in router.winners}
    layer = model.layers[0]
    with torch.no_grad():
        x = model.embed_tokens(tokens)
        cos, sin = model.rotary_emb(x, TOKENS)
        head = ARGS[1] // ARGS[3]
        q = torch.randn(1, ARGS[3], TOKENS, head)
    with torch.no_grad(), router.patched(model):
        layer.input_layernorm(x), layer.mlp(x), module.apply_rotary_pos_emb(q, q, cos, sin)  # bind the forms
        sdpa = next(s for s in router.tally.sites if s.op == "F.scaled_dot_product_attention")
        sdpa.scope.depth += 1  # as inside Attention.forward
        x2 = x.reshape(-1, x.shape[-1])
        w = layer.self_attn.q_proj.weight
        # a module's own call (nn.Module.__call__) is paid by eager too: the direct call goes through one
        norm_direct = Direct(lambda: by_type["rmsnorm"].kernel_fn(x, layer.input_layernorm.weight, eps=1e-6))
        mlp_direct = Direct(lambda: by_type["fused_mlp"].kernel_fn(x2, w, w, w))
        linear_direct = Direct(lambda: router.winners[4].kernel_fn(x2, w.t()))
        cases = {
            "rmsnorm (RMSNorm.forward)": (lambda: layer.input_layernorm(x), norm_direct),
            "fused_mlp (MLP.forward)": (lambda: layer.mlp(x), mlp_direct),
            "matmul (nn.Linear.forward)": (lambda: layer.self_attn.q_proj(x), linear_direct),
            "rotary_embedding (apply_rotary_pos_emb, q and k)": (
                lambda: module.apply_rotary_pos_emb(q, q, cos, sin),
                lambda: (by_type["rotary_embedding"].kernel_fn(q, cos, sin),
                         by_type["rotary_embedding"].kernel_fn(q, cos, sin))),
            "flash_attention (F.scaled_dot_product_attention)": (
                lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
                lambda: by_type["flash_attention"].kernel_fn(q, q, q, causal=True)),
        }
        variants = {}
        for name, (patched, direct) in cases.items():
            variants[name + "/patched"], variants[name + "/direct"] = patched, direct
        medians = interleaved(variants, rounds, n)
        sdpa.scope.depth -= 1
    tally = router.tally.to_json()["per_kernel"]
    assert all(k["calls_served"] > 0 for k in list(tally.values())[:5]), tally
    print("served calls: the stand-in's cost per call beside its kernel (thread CPU time, median):")
    for name in cases:
        cost = medians[name + "/patched"] - medians[name + "/direct"]
        print(f"  {name:52s} {cost:6.2f} us  (patched {medians[name + '/patched']:6.2f}, "
              f"kernel_fn alone {medians[name + '/direct']:6.2f})")


EXPORTED_CHILD = r"""
import json, statistics, sys, torch
sys.path.insert(0, sys.argv[1])
import autokernel_kernels as ak
from benchmarks.patch_overhead import cpu_us, llama
rounds, forwards = int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
_, eager_model, tokens = llama()
_, patched_model, _ = llama()
events = [0, False]
sys.addaudithook(lambda e, a: events.__setitem__(0, events[0] + 1) if events[1] else None)
eager, patched = [], []
with torch.no_grad(), ak.patch(patched_model) as router:
    patched_model(tokens), eager_model(tokens)
    events[1] = True
    patched_model(tokens)
    events[1] = False
    for i in range(rounds):
        order = [(eager, eager_model), (patched, patched_model)]
        for samples, model in (order if i % 2 else order[::-1]):
            samples.append(cpu_us(lambda: model(tokens), forwards))
served = sum(k["calls_served"] for k in router.tally.to_json()["per_kernel"].values())
print(json.dumps({"eager_us": statistics.median(eager), "patched_us": statistics.median(patched),
                  "audit_events_per_forward": events[0], "served": served, "kernels": len(ak.KERNELS)}))
"""


def exported(rounds: int, forwards: int, repeats: int) -> None:
    """Nothing matches, through an exported package (its starter kernels at 16 tokens, the model
    at 8) in a fresh process per figure: AUTOKERNEL_KERNEL_AUDIT on (the audit hook, the launch
    monitor and the op recorder around served calls: every guard) and off, alternating."""
    import json
    import os
    import subprocess
    import tempfile
    from autokernel.deploy.export import Exported, module_name, write_package
    with tempfile.TemporaryDirectory(prefix="patch_overhead_") as parent:
        kernels, sources = [], {}
        for w in winners(2 * TOKENS, never):
            module = module_name(w.target)
            sources[module] = ROOT / "starter_kernels" / "triton" / f"{w.kernel_type}.py"
            kernels.append({"target": w.target, "kernel_type": w.kernel_type, "backend": "triton", "dims": w.dims,
                            "dtype": "float32", "kwargs": w.kwargs, "source": f"kernels/{module}.py",
                            "route": w.route, "modules": w.modules})
        write_package(Exported(None, {"run_id": "bench", "kernels": kernels, "left_out": []}, sources),
                      Path(parent) / "autokernel_kernels")
        figures: dict[str, list] = {"on": [], "off": []}
        for _ in range(repeats):
            for guard in figures:
                env = {**os.environ, "PYTHONPATH": parent, "TRITON_INTERPRET": "1", "AUTOKERNEL_KERNEL_AUDIT": guard}
                done = subprocess.run([sys.executable, "-c", EXPORTED_CHILD, str(ROOT), str(rounds), str(forwards)],
                                      env=env, capture_output=True, text=True, check=True, cwd=parent)
                figures[guard].append(json.loads(done.stdout.strip().splitlines()[-1]))
    for guard, runs in figures.items():
        ratios = [r["patched_us"] / r["eager_us"] for r in runs]
        print(f"exported package, nothing matches, AUTOKERNEL_KERNEL_AUDIT={guard}: patched/eager "
              f"{statistics.median(ratios):.3f}x (median of {len(runs)} processes: "
              f"{', '.join(f'{x:.3f}' for x in ratios)}); audit events per forward "
              f"{runs[0]['audit_events_per_forward']}; {runs[0]['served']} calls served by {runs[0]['kernels']} kernels")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--forwards", type=int, default=10, help="forwards per block")
    ap.add_argument("--calls", type=int, default=2000, help="calls per round for the served-call costs")
    ap.add_argument("--exported", type=int, default=0, metavar="N",
                    help="instead: nothing matches through an exported package, guards on and off, N processes each")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.exported:
        exported(args.rounds, args.forwards, args.exported)
        return
    with torch.no_grad():
        nothing_matches(args.rounds, args.forwards)
    served_calls(args.rounds, args.calls)


if __name__ == "__main__":
    main()
