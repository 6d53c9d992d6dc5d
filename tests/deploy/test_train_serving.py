"""Winners with a backward served as differentiable torch custom ops: opcheck holds, a patched
model trains with the kernel in forward and backward (gradients as eager's), torch.compile traces
through both, and forward-only winners fall back under autograd, each counted with its reason."""
from __future__ import annotations

import torch

from autokernel.deploy import routing
from autokernel.deploy.routing.calls import AUTOGRAD, CONSTANT, unsafe
from tiny_llama import example
from paths import DATA

KERNEL = DATA / "kernels" / "train" / "rmsnorm_grad.py"
MODEL = DATA / "train_tiny.py"
TARGET = "rmsnorm[16x32:float32]"
NORMS = [{"name": "norm", "class": "RMSNorm"}, {"name": "final_norm", "class": "RMSNorm"}]


def counted(fn, calls: list, name: str):
    def call(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)
    return call


def winner(calls: list, backward: bool = True, inference_only: str = "") -> routing.Winner:
    module = routing.load_kernel(KERNEL, "train_rmsnorm_grad")
    return routing.Winner(TARGET, "rmsnorm", {"M": 16, "N": 32}, "float32", counted(module.kernel_fn, calls, "fwd"),
                          {}, "module", NORMS, backward_fn=counted(module.backward_fn, calls, "bwd") if backward else None,
                          inference_only=inference_only)


def tiny():
    module = example(MODEL)
    torch.manual_seed(0)
    return module, module.Model(), torch.randint(0, module.VOCAB, (module.BATCH, module.TOKENS))


def grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def step(module, model, ids) -> float:
    model.zero_grad(set_to_none=True)
    loss = module.loss_fn(model(ids), [ids])
    loss.backward()
    return loss.item()


def test_opcheck_holds_for_a_winner_with_a_backward():
    op = winner([]).registered()
    gen = torch.Generator().manual_seed(0)
    for rows in (16, 5):  # the target and an odd count (the backward's partial sums have a remainder)
        x = torch.randn(rows, 32, generator=gen, requires_grad=True)
        w = torch.randn(32, generator=gen, requires_grad=True)
        results = torch.library.opcheck(op, (x, w), {"eps": 1e-6})
        assert set(results.values()) == {"SUCCESS"}, results


def test_a_patched_model_trains_through_the_kernel_with_eager_gradients():
    module, model, ids = tiny()
    loss = step(module, model, ids)
    expected = grads(model)
    calls = []
    router = routing.Router([winner(calls)])
    with router.patched(model):
        patched_loss = step(module, model, ids)
    assert calls.count("fwd") == 2 and calls.count("bwd") == 2  # both norms, forward and backward
    assert abs(patched_loss - loss) < 1e-6
    for name, g in grads(model).items():
        assert torch.allclose(g, expected[name], rtol=1e-4, atol=1e-6), name
    kernel = router.tally.to_json()["per_kernel"][TARGET]
    assert kernel["calls_served"] == 2 and kernel["fallbacks"] == 0


def test_torch_compile_traces_the_winner_in_forward_and_backward():
    module, model, ids = tiny()
    loss = step(module, model, ids)
    expected = grads(model)
    calls, graphs = [], []

    def backend(gm, example_inputs):  # AOTAutograd's joint graph, split into forward and backward
        from functorch.compile import make_boxed_func
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(g, _):
            graphs.append(g)
            return make_boxed_func(g.forward)
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)
    torch._dynamo.reset()
    with routing.Router([winner(calls)]).patched(model):
        step(module, model, ids)  # the first eager forward binds the hand-written forms
        before = len(calls)
        compiled = torch.compile(model, backend=backend)
        model.zero_grad(set_to_none=True)
        compiled_loss = module.loss_fn(compiled(ids), [ids])
        compiled_loss.backward()
    assert calls[before:].count("fwd") == 2 and calls[before:].count("bwd") == 2
    ops = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum(op.startswith("autokernel.") and "backward" not in op for op in ops) == 2
    assert sum(op.startswith("autokernel.") and "backward" in op for op in ops) == 2
    assert abs(compiled_loss.item() - loss) < 1e-6
    for name, g in grads(model).items():
        assert torch.allclose(g, expected[name], rtol=1e-4, atol=1e-6), name


def test_forward_only_winners_fall_back_under_autograd_with_their_reason():
    module, model, ids = tiny()
    calls = []
    plain, failed = winner(calls, backward=False), winner(calls, backward=False,
                                                          inference_only="inference only: the backward failed gradients")
    for w, reason in ((plain, AUTOGRAD), (failed, "autograd: inference only: the backward failed gradients "
                                                  "(run under torch.no_grad)")):
        router = routing.Router([w])
        with router.patched(model):
            step(module, model, ids)
            with torch.no_grad():
                model(ids)  # without autograd the same winner serves
        kernel = router.tally.to_json()["per_kernel"][TARGET]
        assert kernel["fallback_reasons"] == {reason: 2} and kernel["calls_served"] == 2
    assert "bwd" not in calls


def test_a_gradient_asked_of_a_constant_input_falls_back():
    x, table = torch.randn(1, 2, 8, 16, requires_grad=True), torch.randn(8, 16)
    assert unsafe((x, table, table), "rotary_embedding") == AUTOGRAD  # x's gradient: the backward gives it
    assert unsafe((x, table.requires_grad_(), table), "rotary_embedding") == CONSTANT  # cos's: it does not
    with torch.no_grad():
        assert unsafe((x, table, table), "rotary_embedding") == ""


def test_a_backward_with_the_wrong_gradients_raises_naming_what_it_must_return():
    module = routing.load_kernel(KERNEL, "train_rmsnorm_grad_wrong")
    x, w = torch.randn(16, 32, requires_grad=True), torch.randn(32, requires_grad=True)
    for backward, words in ((lambda g, out, x, w, eps=1e-6: module.backward_fn(g, out, x, w, eps)[:1],
                             "returned 1 gradient(s); a rmsnorm backward returns 2, for x, weight"),
                            (lambda g, out, x, w, eps=1e-6: (module.backward_fn(g, out, x, w, eps)[0], x[:1]),
                             "the gradient for weight is (1, 32)"),
                            # autograd's engine would cast a float64 gradient back without a word
                            (lambda g, out, x, w, eps=1e-6: (module.backward_fn(g, out, x, w, eps)[0],
                                                             module.backward_fn(g, out, x, w, eps)[1].double()),
                             "the gradient for weight is (32,) torch.float64; it must be shaped like weight: "
                             "(32,) torch.float32")):
        op = routing.Winner(TARGET, "rmsnorm", {"M": 16, "N": 32}, "float32", module.kernel_fn,
                            backward_fn=backward).registered()
        try:
            op(x, w, eps=1e-6).sum().backward()
        except RuntimeError as e:
            assert words in str(e)
        else:
            raise AssertionError("a backward with the wrong gradients was accepted")


def test_a_winner_found_in_the_loss_serves_the_training_steps_loss_outside_the_model():
    """The profile records a training step's cross-entropy under `loss` (the file's loss_fn, outside
    the model): patched, F.cross_entropy is served wherever the step calls it, forward and
    backward, with eager's loss and gradients; unpatched, it is PyTorch's again."""
    import torch.nn.functional as F
    from starter_kernels import starter_path
    module = routing.load_kernel(starter_path("cross_entropy"), "loss_cross_entropy")
    calls: list = []
    loss_winner = routing.Winner("cross_entropy[6x32:float32]", "cross_entropy", {"N": 6, "V": 32}, "float32",
                                 counted(module.kernel_fn, calls, "fwd"), {}, "op", [{"name": "", "class": "loss"}],
                                 backward_fn=counted(module.backward_fn, calls, "bwd"))
    torch.manual_seed(0)
    model, x, y = torch.nn.Linear(8, 32), torch.randn(6, 8), torch.randint(0, 32, (6,))
    eager = F.cross_entropy(model(x), y)
    eager.backward()
    expected = model.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    with routing.Router([loss_winner]).patched(model):
        served = F.cross_entropy(model(x), y)
        served.backward()
    assert calls == ["fwd", "bwd"]
    torch.testing.assert_close(served, eager)
    torch.testing.assert_close(model.weight.grad, expected)
    F.cross_entropy(model(x), y)
    assert calls == ["fwd", "bwd"]  # the patch is gone with its context
    from autokernel.deploy.routing.binding import LOSS
    from autokernel.profile.attribution import LOSS as PROFILED
    assert LOSS == PROFILED  # the exported routing spells the profile's marker itself


def test_a_loss_with_ignored_targets_is_served_on_the_rows_it_keeps():
    """A causal LM's shifted labels always end in ignored targets (-100): the mean over the targets
    kept is the kernel's mean over their rows alone, and autograd gives the ignored rows zero
    gradient, as PyTorch does. Every target ignored (PyTorch's 0/0) falls back, saying so."""
    import torch.nn.functional as F
    from starter_kernels import starter_path
    module = routing.load_kernel(starter_path("cross_entropy"), "loss_cross_entropy")
    calls: list = []
    kept = routing.Winner("cross_entropy[4x32:float32]", "cross_entropy", {"N": 4, "V": 32}, "float32",
                          counted(module.kernel_fn, calls, "fwd"), {}, "op", [{"name": "", "class": "loss"}],
                          backward_fn=counted(module.backward_fn, calls, "bwd"))
    from autokernel.deploy.routing.serving import ServingRange, Shape
    kept.serving = kept.training_serving = ServingRange(  # judged at 1, 4 and 8 rows: 1 to 8 serve
        "cross_entropy", "float32", {"N": 4, "V": 32}, shapes=[Shape({"N": n, "V": 32}, True) for n in (1, 4, 8)])
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 32), torch.randn(6, 8)
    y = torch.tensor([3, -100, 7, 31, -100, 0])
    eager = F.cross_entropy(model(x), y)
    eager.backward()
    expected = model.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    router = routing.Router([kept])
    with router.patched(model):
        served = F.cross_entropy(model(x), y)
        served.backward()
        assert calls == ["fwd", "bwd"]
        F.cross_entropy(model(x), torch.full((6,), -100))  # nothing kept: PyTorch's nan, not the kernel's
    torch.testing.assert_close(served, eager)
    torch.testing.assert_close(model.weight.grad, expected)
    kernel = router.tally.to_json()["per_kernel"]["cross_entropy[4x32:float32]"]
    assert kernel["calls_served"] == 1 and kernel["fallback_reasons"] == {"every target ignored (ignore_index)": 1}
