"""GPU: the test rmsnorm winner (tests/data/kernels/train/rmsnorm_grad.py) as a differentiable
custom op (torch.library.opcheck, fp32 and fp16, 37 x 4096), then verify --train's comparison and
figures on cuda with tests/data/train_tiny.py: 20 AdamW steps, peak memory, torch.compile.
Writes $OUT/gpu_train.json (else /tmp). Run from the repository root: python benchmarks/train_serving.py"""
import json, os, sys, time, tempfile
sys.path.insert(0, "tests/support"); sys.path.insert(0, "tests/deploy")
import torch
from autokernel.deploy import routing
from autokernel.deploy.verify_train import verify_train
from autokernel.profile.modelfile import ModelSpec, load_model
out = {}
m = routing.load_kernel("tests/data/kernels/train/rmsnorm_grad.py", "k_rms")
for dtype in (torch.float32, torch.float16):
    w = routing.Winner("rmsnorm[16x32]", "rmsnorm", {"M": 16, "N": 32}, str(dtype)[6:], m.kernel_fn, backward_fn=m.backward_fn)
    x = torch.randn(37, 4096, device="cuda", dtype=dtype, requires_grad=True)
    wt = torch.randn(4096, device="cuda", dtype=dtype, requires_grad=True)
    t = time.time()
    out[f"opcheck_{dtype}"] = torch.library.opcheck(w.registered(), (x, wt), {"eps": 1e-6})
    print(out[f"opcheck_{dtype}"], time.time() - t, flush=True)
loaded = load_model(ModelSpec(path="tests/data/train_tiny.py", device="cuda"))
w = routing.Winner("rmsnorm[16x32:float32]", "rmsnorm", {"M": 16, "N": 32}, "float32", m.kernel_fn, {}, "module",
                   [{"name": "norm", "class": "RMSNorm"}, {"name": "final_norm", "class": "RMSNorm"}], backward_fn=m.backward_fn)
t = time.time()
r = verify_train(loaded, [w], steps=20, compile_baseline=True, log=lambda s: print(s, flush=True))
r["wall_s"] = time.time() - t
out["train"] = r
print(json.dumps({k: v for k, v in r.items() if k not in ("losses", "loss_rel_err")}, indent=1), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_train.json"), "w"), indent=1, default=str)
