"""The tiny LLaMA example with winners on every route: kernels written in PyTorch for the router's
own tests, and finished runs whose winners are the Triton starters for verify's."""
import importlib.util
from pathlib import Path

import torch

from autokernel.deploy import routing
from autokernel.search.run import RunDir, TargetState
from harness.kernel_types.registry import Case
from sealed_runs import record_baseline, write_run
from paths import EXAMPLES

LLAMA = EXAMPLES / "llama_tiny.py"
# LlamaTiny(vocab, dim, layers, heads, ffn): head dim 16, 8 tokens; small enough for the interpreter
LLAMA_ARGS = [64, 32, 1, 2, 64]
NORMS = [{"name": n, "class": "RMSNorm"} for n in ("layers.0.input_layernorm", "layers.0.post_attention_layernorm", "norm")]
ATTENTION = [{"name": "layers.0.self_attn", "class": "Attention"}]
# (target, kernel type, dims, kwargs, route, modules, calls per forward)
TARGETS = [
    ("rmsnorm[8x32:float32]", "rmsnorm", {"M": 8, "N": 32}, {}, "module", NORMS, 3),
    ("rotary_embedding[1x2x8x16:float32]", "rotary_embedding", {"B": 1, "H": 2, "S": 8, "D": 16}, {}, "pattern", ATTENTION, 2),
    ("fused_mlp[8x32x64:float32]", "fused_mlp", {"M": 8, "D": 32, "F": 64}, {}, "module",
     [{"name": "layers.0.mlp", "class": "MLP"}], 1),
    ("flash_attention[1x2x8x16:float32,causal]", "flash_attention", {"B": 1, "H": 2, "S": 8, "D": 16},
     {"causal": True}, "op", ATTENTION, 1),
    ("matmul[8x32x32:float32]", "matmul", {"M": 8, "K": 32, "N": 32}, {}, "op",
     [{"name": f"layers.0.self_attn.{p}_proj", "class": "Linear"} for p in "qkvo"] + [{"name": "lm_head", "class": "Linear"}],
     4),
]


def example(path: Path = LLAMA):
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytorch_kernel(kernel_type, calls):
    def kernel_fn(*args, **kwargs):
        calls.append(kernel_type)
        out = routing.REFERENCES[kernel_type](*args, **kwargs)
        return out if kernel_type == "cross_entropy" else out.to(args[0].dtype)
    return kernel_fn


def winners(calls, targets=TARGETS):
    return [routing.Winner(t, kt, dims, "float32", pytorch_kernel(kt, calls), kwargs, route, modules)
            for t, kt, dims, kwargs, route, modules, _ in targets]


def llama():
    module = example()
    torch.manual_seed(0)
    return module, module.LlamaTiny(*LLAMA_ARGS).eval(), torch.randint(0, 64, (1, 8))


def make_run(root: Path, targets=TARGETS, dtype: str = "float32", model_dtype=None, name: str = "run-starters",
             exact: tuple = (), device: str = "cpu", plan_extra=None) -> Path:
    """A finished run on the tiny LLaMA whose winners are the Triton starters at its shapes (the
    targets' dtype `dtype`; the model cast to `model_dtype` when given; on `device`). Each winner's
    verdict says the judge proved it at the shapes around its target, except those named in `exact`:
    records from before serving ranges, their target alone."""
    from autokernel.profile.modelfile import ModelSpec
    from starter_kernels import starter_path
    spec = ModelSpec(path=str(LLAMA), class_name="LlamaTiny", input_shape=[1, 8], input_dtype="tokens",
                     vocab_size=64, init_args=LLAMA_ARGS, device=device, dtype=model_dtype)
    sources = [(target, kernel_type, dims, kwargs, route, modules, starter_path(kernel_type).read_text())
               for target, kernel_type, dims, kwargs, route, modules, _ in targets]
    return write_run(root, spec, sources, name, dtype, verdict=lambda t: None if t.name in exact else proven_around(t),
                     plan_extra=plan_extra).path


def proven_around(t: TargetState) -> dict:
    """A passing verdict that checked the kernel at the shapes around its target (CPU figures)."""
    from harness.verdict import around
    cases = around.cases(Case.make(t.kernel_type, t.dims, t.dtype, **t.kwargs), t.dtype)
    return {"verdict": "PASS", "timing": {"median_us": 100.0, "baseline_median_us": 50.0, "representative_of_gpu": False},
            "timing_around": {"skipped": None, "shapes": [{"dims": c.dims, "ok": True, "failed": False,
                                                          "median_us": 100.0, "baseline_median_us": 50.0} for c in cases]}}


WRONG_RMSNORM = '''
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"


@triton.jit
def _scale(y_ptr, x_ptr, w_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * n + cols, x * w, mask=mask)  # forgets to normalise


def kernel_fn(x, weight, eps=1e-6):
    x2 = x.contiguous().reshape(-1, x.shape[-1])
    y = x2.new_empty(x2.shape)
    _scale[(x2.shape[0],)](y, x2, weight, x2.shape[1], BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
'''


def rewrite_winner(run: RunDir, target: str, source: str) -> None:
    """A run whose winner at `target` was judged (and passed at its target) yet is wrong in the model:
    its records say so consistently, so the seal holds and verify itself has to catch it."""
    state = run.load_state()
    t = next(t for t in state.targets if t.name == target)
    t.history.clear()
    run.leaderboard_path.write_text("".join(line for line in run.leaderboard_path.read_text().splitlines(True)
                                            if f"\t{target}\t" not in line))
    record_baseline(run, t, source)
    run.save_state(state)
