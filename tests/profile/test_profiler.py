"""The profiler: measured time by kernel type, hand-written forms recognised by the ops they run,
shares that add up to 1, and the `profile` command's JSON."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autokernel.profile import profiler
from autokernel.profile.modelfile import load_model, spec_from_options
from paths import DATA, ROOT

EXAMPLES = ROOT / "examples"
DESIGN_KEYS = {"device", "dtype", "total_ms", "coverage", "entries", "total_ceiling_e2e_speedup"}
DESIGN_ENTRY_KEYS = {"rank", "kernel_type", "op", "shapes", "dtype", "calls", "time_ms", "share", "bound",
                     "ceiling_speedup", "projected_e2e_speedup"}


def run_profile(path, iters=2, **options):
    return profiler.profile_model(load_model(spec_from_options(path, device="cpu", **options)),
                                  iters=iters, warmup=1)


def by_type(prof):
    found = {}
    for g in prof.groups:
        found.setdefault(g["kernel_type"], []).append(g)
    return found


def write(tmp_path, text, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def llama():
    return run_profile(EXAMPLES / "llama_tiny.py")


def test_llama_time_lands_in_named_kernel_types(llama):
    types = by_type(llama)
    assert {"rmsnorm", "rotary_embedding", "fused_mlp", "flash_attention", "matmul"} <= set(types)
    assert llama.coverage >= 0.95  # typed and module targets
    assert sum(g["share"] for g in llama.groups) == pytest.approx(1.0, abs=0.01)
    assert llama.total_ms == pytest.approx(sum(g["time_ms"] for g in llama.groups))


def test_llama_groups_carry_what_the_search_and_verify_need(llama):
    types = by_type(llama)
    (rms,) = types["rmsnorm"]
    assert rms["route"] == "module" and rms["calls"] == 9  # 2 per layer x 4 + the final norm
    assert rms["dims"] == {"M": 128, "N": 384} and rms["target"] == "rmsnorm[128x384:float32]"
    assert {"name": "layers.0.input_layernorm", "class": "RMSNorm"} in rms["modules"]
    assert {"aten::pow", "aten::mean", "aten::rsqrt"} <= set(rms["ops"])
    (mlp,) = types["fused_mlp"]
    assert mlp["route"] == "module" and mlp["dims"] == {"M": 128, "D": 384, "F": 1024}
    assert mlp["shapes"] == [[1, 128, 384], [1024, 384], [1024, 384], [384, 1024]]
    assert [m["class"] for m in mlp["modules"]] == ["MLP"] * 4
    assert {p["kernel_type"] for p in mlp["parts"]} >= {"matmul"}
    (rope,) = types["rotary_embedding"]
    assert rope["route"] == "pattern" and rope["calls"] == 8  # q and k in 4 layers
    assert rope["dims"] == {"B": 1, "H": 6, "S": 128, "D": 64}
    (attn,) = types["flash_attention"]
    assert attn["route"] == "op" and attn["causal"] is True and attn["dims"] == {"B": 1, "H": 6, "S": 128, "D": 64}
    assert "aten::scaled_dot_product_attention" in attn["ops"]
    linears = {g["target"]: g for g in types["matmul"]}
    assert linears["matmul[128x384x384:float32]"]["calls"] == 16  # q, k, v, o in 4 layers
    assert linears["matmul[128x384x2048:float32]"]["modules"] == [{"name": "lm_head", "class": "Linear"}]
    assert "aten::linear" in linears["matmul[128x384x384:float32]"]["ops"]
    # the gate/up/down projections are the SwiGLU group's, not counted again as matmuls
    assert not any("mlp" in m["name"] for g in types["matmul"] for m in g["modules"])


def test_gpt2_layernorm_softmax_matmul_and_explicit_attention():
    prof = run_profile(EXAMPLES / "gpt2_tiny.py")
    types = by_type(prof)
    assert {"layernorm", "softmax", "matmul", "flash_attention"} <= set(types)
    assert types["softmax"][0]["route"] == "op"  # the sampler's softmax over the vocabulary
    assert sum(g["share"] for g in prof.groups) == pytest.approx(1.0, abs=0.01)
    (attn,) = types["flash_attention"]
    assert attn["route"] == "pattern" and attn["causal"] is True  # the module's tril buffer
    assert attn["dims"] == {"B": 1, "H": 6, "S": 128, "D": 64}
    softmax = [p for p in attn["parts"] if p["kernel_type"] == "softmax"]
    assert softmax and softmax[0]["target"] == "softmax[768x128:float32]"
    assert sum(p["share"] for p in attn["parts"]) == pytest.approx(attn["share"])
    assert types["layernorm"][0]["calls"] == 9 and types["layernorm"][0]["route"] == "op"
    # the tanh GELU is no kernel type: it is its module's target, with the module's inputs
    gelu = [g for g in types["module"] if g["module"]["label"] == "MLP.gelu"]
    assert gelu and gelu[0]["target"] == "module[MLP.gelu:1x128x1536:float32]"
    assert gelu[0]["calls"] == 4 and "aten::gelu" in gelu[0]["ops"]
    assert gelu[0]["module"]["inputs"]["args"][0]["tensor"]["shape"] == [1, 128, 1536]
    assert "aten::gelu" not in [o["op"] for o in types["other"][0]["other_ops"]]
    assert prof.coverage >= 0.95


def test_forms_are_recognised_by_their_ops_not_their_class_names(tmp_path):
    path = write(tmp_path, """
        import torch, torch.nn as nn

        class Scaler(nn.Module):          # does RMSNorm's work under another name
            def __init__(self, n):
                super().__init__()
                self.g = nn.Parameter(torch.ones(n))
            def forward(self, x):
                return self.g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))

        class RMSNorm(nn.Module):         # the name, without the work
            def forward(self, x):
                return x * 2.0

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = Scaler(64), RMSNorm()
            def forward(self, x):
                return self.b(self.a(x))

        def get_inputs():
            return [torch.randn(32, 64)]
        """)
    types = by_type(run_profile(path))
    (rms,) = types["rmsnorm"]
    assert rms["modules"] == [{"name": "a", "class": "Scaler"}] and rms["dims"] == {"M": 32, "N": 64}
    # the impostor's multiply is its own module's target, not RMSNorm
    (impostor,) = types["module"]
    assert impostor["module"]["qualname"] == "b" and impostor["ops"] == ["aten::mul"]
    assert impostor["target"] == "module[Model.b:32x64:float32]" and "other" not in types


def test_explicit_attention_without_mask_and_cross_entropy_pair(tmp_path):
    path = write(tmp_path, """
        import torch, torch.nn as nn, torch.nn.functional as F

        class Model(nn.Module):
            def forward(self, q, k, v, targets):
                p = torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1)
                o = (p @ v).flatten(0, 2)
                return F.nll_loss(F.log_softmax(o, dim=-1), targets), F.log_softmax(o, dim=-1)

        def get_inputs():
            return [torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8),
                    torch.randint(0, 8, (64,))]
        """)
    types = by_type(run_profile(path))
    (attn,) = types["flash_attention"]
    assert attn["causal"] is False and attn["dims"] == {"B": 2, "H": 2, "S": 16, "D": 8}
    (ce,) = types["cross_entropy"]
    assert ce["dims"] == {"N": 64, "V": 8} and ce["route"] == "pattern"
    # a log_softmax on its own is not a cross-entropy
    assert "aten::log_softmax" in [o["op"] for o in types["other"][0]["other_ops"]]


@pytest.mark.parametrize("name, kernel_type, target", [
    ("softmax", "softmax", "softmax[64x4096:float32]"),
    ("rmsnorm", "rmsnorm", "rmsnorm[512x1024:float32]"),
    ("matmul", "matmul", "matmul[512x1024x512:float32]"),
    ("layernorm", "layernorm", "layernorm[1024x1024:float32]"),
    ("cross_entropy", "cross_entropy", "cross_entropy[128x8192:float32]"),
])
def test_kernelbench_examples_map_to_their_type(name, kernel_type, target):
    prof = run_profile(EXAMPLES / "kernelbench" / f"{name}.py", iters=1)
    top = prof.groups[0]
    assert (top["kernel_type"], top["target"]) == (kernel_type, target)
    assert prof.coverage > 0.95


def test_each_call_counts_at_its_fastest():
    # two iterations of two calls each; a stall in one call of one iteration is left out
    assert profiler._best_us([[1.0, 50.0], [3.0, 2.0]]) == pytest.approx(3.0)
    # calls that differ between iterations: the fastest whole iteration
    assert profiler._best_us([[1.0, 5.0, 1.0], [4.0, 2.0]]) == pytest.approx(6.0)


def test_trace_is_written(tmp_path):
    trace = tmp_path / "trace.json"
    loaded = load_model(spec_from_options(EXAMPLES / "kernelbench" / "softmax.py", device="cpu"))
    profiler.profile_model(loaded, iters=1, warmup=0, trace_path=str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::softmax" in names and profiler.ROOT in names


def test_the_profiler_s_chatter_is_held_back_and_everything_else_passes(tmp_path, capfd):
    path = write(tmp_path, """
        import sys
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                print("the model's own warning", file=sys.stderr)
                return torch.softmax(x, -1)
        def get_inputs():
            return [torch.randn(4, 8)]
        """)
    capfd.readouterr()
    profiler.profile_model(load_model(spec_from_options(path, device="cpu")), iters=1, warmup=0)
    err = capfd.readouterr().err
    assert "the model's own warning" in err
    assert not any(profiler.PROFILER_CHATTER.match(line) for line in err.splitlines()), err
    # what kineto writes, as it writes it, is what the filter drops
    assert profiler.PROFILER_CHATTER.match("USDT:2026-12-01 03:56:05 28063:28063 SyncActivityProfilerHandler.cpp:52] "
                                           "profiler_start")


# ---------------------------------------------------------------- the command
@pytest.fixture
def seeded_peaks(tmp_path, monkeypatch):
    """A peaks cache already in place, so the command does not spend seconds probing."""
    from harness.device import peaks

    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path / "cache"))
    path = peaks.cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": "test cpu", "copy_gbps": 20.0, "matmul_tflops": {"float32": 0.2},
                                "measured_at": "2026-01-01T00:00:00+00:00", "method": "seeded by a test"}))
    return {**os.environ, "AUTOKERNEL_CACHE_DIR": str(tmp_path / "cache")}


def autokernel(args, env, cwd=ROOT):
    # wide: a message naming a long temporary path must not be wrapped inside the words a test looks for
    return subprocess.run([sys.executable, "-m", "autokernel", *args], capture_output=True, text=True,
                          env={**env, "COLUMNS": "400"}, cwd=cwd, timeout=300)


def test_profile_command_json_on_stdout(seeded_peaks, tmp_path):
    trace = tmp_path / "t.json"
    done = autokernel(["profile", "examples/llama_tiny.py", "--json", "-", "--iters", "2", "--warmup", "1",
                       "--trace", str(trace)], seeded_peaks)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)  # stdout is the JSON and nothing else
    assert DESIGN_KEYS <= set(plan)
    assert plan["device"] == "cpu" and plan["cpu_figures"] is True and plan["device_name"] == "test cpu"
    for entry in plan["entries"]:
        assert DESIGN_ENTRY_KEYS <= set(entry)
        if entry["kernel_type"] != "other":
            assert {"dims", "target", "modules", "ops", "route"} <= set(entry)
            assert entry["bound"] in ("memory", "compute") and entry["ceiling_speedup"] >= 1.0
    assert [e["rank"] for e in plan["entries"]] == list(range(1, len(plan["entries"]) + 1))
    assert sum(e["share"] for e in plan["entries"]) == pytest.approx(1.0, abs=0.01)
    assert plan["coverage"] >= 0.9 and plan["total_ceiling_e2e_speedup"] >= 1.0
    assert plan["model"]["path"] == "examples/llama_tiny.py"
    assert "rmsnorm[128x384" in done.stderr and "CPU figures" in done.stderr  # the table went to stderr
    assert json.loads(trace.read_text())["traceEvents"]


def test_profile_command_raises_a_busy_cached_peak_to_what_ran(seeded_peaks, tmp_path):
    """A cache probed while the machine was busy (fp32 at 1e-4 TFLOP/s, beaten by every matmul)
    is probed again and raised; the plan and the cache hold the higher figure."""
    from harness.device import peaks
    path = Path(seeded_peaks["AUTOKERNEL_CACHE_DIR"]) / "peaks" / peaks.cache_path("cpu").name
    busy = {**json.loads(path.read_text()), "matmul_tflops": {"float32": 1e-4}}
    path.write_text(json.dumps(busy))
    done = autokernel(["profile", "examples/llama_tiny.py", "--json", "-", "--iters", "1", "--warmup", "0"],
                      seeded_peaks)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    fp32 = plan["peaks"]["matmul_tflops"]["float32"]
    matmuls = [e for e in plan["entries"] if e["kernel_type"] == "matmul"]
    assert matmuls and fp32 > 1e-4 and all(e["flops"] / e["per_call_us"] / 1e6 <= fp32 * (1 + 1e-9) for e in matmuls)
    assert json.loads(path.read_text())["matmul_tflops"]["float32"] == fp32
    assert "float32" in plan["peaks"]["raised"] and "delete" not in done.stderr


def test_profile_command_plain_module_options(seeded_peaks, tmp_path):
    out = tmp_path / "p" / "profile.json"
    done = autokernel(["profile", "examples/gpt2_tiny.py", "--class-name", "GPT2Tiny", "--input-dtype", "tokens",
                       "--vocab-size", "2048", "--input-shape", "1,64", "--iters", "1", "--warmup", "0",
                       "--json", str(out), "--records", str(tmp_path / "records.json")], seeded_peaks)
    assert done.returncode == 0, done.stderr
    from autokernel.profile.records import Records
    assert any(op.name == profiler.ROOT for op in Records.load(tmp_path / "records.json").ops)
    plan = json.loads(out.read_text())
    assert plan["model"]["class_name"] == "GPT2Tiny" and plan["model"]["input_shape"] == [1, 64]
    targets = {e["target"] for e in plan["entries"]}
    assert "layernorm[64x384:float32]" in targets
    assert "layernorm[64x384" in done.stdout  # the table, on stdout when the JSON goes to a file


def test_profile_command_reports_the_users_error(seeded_peaks, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x)\n        return x\n")
    done = autokernel(["profile", str(bad)], seeded_peaks)
    assert done.returncode == 1
    message = " ".join(done.stderr.split())  # the console wraps long lines
    assert f"{bad}:3: syntax error" in message and "Traceback" not in message


# ---------------------------------------------------------------- a recorded CUDA profile
# The targets of the bf16 LlamaTiny run on an H200 (plan.json of that run), which lost their dtype.
H200_TARGETS = {"rotary_embedding[4x16x512x128:]", "rmsnorm[2048x2048:]", "fused_mlp[2048x2048x5632:]",
                "matmul[2048x2048x32000:]", "matmul[2048x2048x2048:]", "flash_attention[4x16x512x128:]"}


def cuda_records():
    from autokernel.profile.records import Records
    return Records.load(DATA / "cuda_profile_llama_tiny_bf16.json")


@pytest.fixture(scope="module")
def llama_modules():
    sys.path.insert(0, str(DATA))
    try:
        from make_cuda_profile import llama_tiny
    finally:
        sys.path.remove(str(DATA))
    return dict(llama_tiny().named_modules())


def test_a_bf16_model_on_cuda_gets_bf16_targets_from_its_cpu_side_op_records(llama_modules):
    records = cuda_records()
    assert records.device == "cuda" and records.kernels and records.launches
    groups = profiler.attribute(records, llama_modules)
    named = [g for g in groups if g["kernel_type"] not in ("other", "module")]
    assert {g["dtype"] for g in groups if g["kernel_type"] == "module" and g["ops"]} == {"bfloat16"}
    assert {g["target"] for g in named} == {t.replace(":]", ":bfloat16]") for t in H200_TARGETS}
    assert all(g["dtype"] == "bfloat16" for g in named)
    assert {g["target"]: g["calls"] for g in named}["rmsnorm[2048x2048:bfloat16]"] == 5
    # runtime calls are how time is joined, not ops of the model
    assert not any("cudaLaunch" in op for g in groups for op in g["ops"])


def test_every_kernel_is_timed_once_under_the_op_that_launched_it(llama_modules):
    records = cuda_records()
    groups = profiler.attribute(records, llama_modules)
    total_us = sum(k.duration_us for k in records.kernels)
    assert sum(g["time_ms"] for g in groups) * 1e3 == pytest.approx(total_us)
    # the RMSNorm modules' time: kernels whose launch ran inside an RMSNorm range (read off the
    # launches' timestamps, not off the kernels' links)
    norms = [op for op in records.ops if op.name.startswith("module::") and op.name.endswith("::RMSNorm")]
    launched = {r.correlation for r in records.launches
                if any(n.start_ns <= r.start_ns and r.end_ns <= n.end_ns for n in norms)}
    norm_us = sum(k.duration_us for k in records.kernels if k.correlation in launched)
    rmsnorm = next(g for g in groups if g["kernel_type"] == "rmsnorm")
    assert norm_us > 0 and rmsnorm["time_ms"] * 1e3 == pytest.approx(norm_us)


def test_kernels_without_a_link_join_their_op_through_the_launch(llama_modules):
    linked = profiler.attribute(cuda_records(), llama_modules)
    records = cuda_records()
    assert any(k.op for k in records.kernels) and any(not k.op for k in records.kernels)
    for k in records.kernels:
        k.op = 0
    for launch in records.launches:
        launch.op = 0  # only time containment is left
    assert profiler.attribute(records, llama_modules) == linked


def test_records_without_ids_of_their_own_give_the_same_attribution(llama_modules):
    """Ranges and ops are told apart by their place, not their ids: with every id 0 (and so no
    link usable), the kernels still join their ops through the launches inside the op ranges."""
    linked = profiler.attribute(cuda_records(), llama_modules)
    records = cuda_records()
    for op in records.ops:
        op.id = 0
    assert profiler.attribute(records, llama_modules) == linked


def test_a_target_whose_dtype_was_not_recorded_is_an_error(llama_modules):
    from autokernel.errors import UserError
    records = cuda_records()
    for op in records.ops:
        op.dtypes = []
    with pytest.raises(UserError, match="no dtype"):
        profiler.attribute(records, llama_modules)


def test_cpu_profiles_record_and_reattribute_the_same(tmp_path):
    """The records a CPU profile keeps give the same groups when attributed again."""
    from autokernel.profile.records import Records
    path = tmp_path / "records.json"
    loaded = load_model(spec_from_options(EXAMPLES / "llama_tiny.py", device="cpu", dtype="bfloat16"))
    prof = profiler.profile_model(loaded, iters=1, warmup=0, records_path=str(path))
    records = Records.load(path)
    assert records.device == "cpu" and not records.kernels
    again = profiler.attribute(records, dict(loaded.model.named_modules()), prof.module_inputs, prof.dtype)
    assert again == prof.groups
    assert {g["dtype"] for g in prof.groups if g["kernel_type"] != "other"} == {"bfloat16"}
