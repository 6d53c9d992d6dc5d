"""Loading the user's model: KernelBench files, plain nn.Module files, options, and errors that
point at the user's own file and line."""
import json
import textwrap
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from autokernel.errors import UsageError, UserError
from autokernel.profile.modelfile import (LoadedModel, ModelOptions, ModelSpec, load_model, model_options,
                                  parse_init_args, spec_from_options)
from paths import EXAMPLES


TINY = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(x)


class TokenNet(nn.Module):
    def __init__(self, vocab, dim, scale=1.0):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.block = Block(dim)
        self.scale = scale

    def forward(self, ids):
        return self.block(self.emb(ids)) * self.scale
"""


def write(tmp_path: Path, text: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cpu_spec(path, **options) -> ModelSpec:
    return spec_from_options(path, device="cpu", **options)


def test_kernelbench_file_as_it_is():
    loaded = load_model(cpu_spec(EXAMPLES / "kernelbench" / "rmsnorm.py"))
    assert isinstance(loaded, LoadedModel) and not loaded.model.training
    assert loaded.model.weight.shape == (1024,)  # from get_init_inputs()
    a, b, c = loaded.make_inputs(1), loaded.make_inputs(1), loaded.make_inputs(2)
    assert a[0].shape == (4, 128, 1024)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    out = loaded.forward(a)
    assert out.shape == a[0].shape and not out.requires_grad


def test_inputs_do_not_disturb_the_global_rng():
    loaded = load_model(cpu_spec(EXAMPLES / "kernelbench" / "softmax.py"))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    loaded.make_inputs(0)
    assert torch.equal(torch.rand(3), expected)


def test_two_loads_build_the_same_weights(tmp_path):
    path = write(tmp_path, TINY)
    spec = cpu_spec(path, class_name="TokenNet", input_shape="2,5", input_dtype="tokens", vocab_size=11,
                    init_args="[11, 8]")
    w1 = load_model(spec).model.block.proj.weight
    torch.manual_seed(999)  # whatever the caller's RNG state
    w2 = load_model(spec).model.block.proj.weight
    assert torch.equal(w1, w2)


def test_plain_module_with_tokens_and_init_args(tmp_path):
    path = write(tmp_path, TINY)
    spec = cpu_spec(path, class_name="TokenNet", input_shape="2,5", input_dtype="tokens", vocab_size=11,
                    init_args="11, 8, 0.5")
    loaded = load_model(spec)
    assert loaded.model.scale == 0.5
    (ids,) = loaded.make_inputs(0)
    assert ids.dtype == torch.int64 and ids.shape == (2, 5) and 0 <= ids.min() and ids.max() < 11
    assert loaded.forward([ids]).shape == (2, 5, 8)


def test_dtype_casts_model_and_float_inputs_only(tmp_path):
    path = write(tmp_path, TINY)
    loaded = load_model(cpu_spec(path, class_name="Block", input_shape="3,8", init_args="[8]", dtype="bf16"))
    assert loaded.model.proj.weight.dtype == torch.bfloat16 and loaded.spec.dtype == "bfloat16"
    assert loaded.make_inputs(0)[0].dtype == torch.bfloat16
    tokens = load_model(cpu_spec(path, class_name="TokenNet", input_shape="1,4", input_dtype="tokens",
                                 vocab_size=5, init_args="[5, 8]", dtype="float16"))
    assert tokens.make_inputs(0)[0].dtype == torch.int64
    assert tokens.model.emb.weight.dtype == torch.float16


def test_spec_round_trips_through_json(tmp_path):
    spec = cpu_spec(write(tmp_path, TINY), class_name="TokenNet", input_shape="1x16", input_dtype="tokens",
                    vocab_size=7, init_args='[7, 4, 2.0]', dtype="float32")
    text = json.dumps(spec.to_json())
    again = ModelSpec.from_json(json.loads(text))
    assert again == spec and again.input_shape == [1, 16] and again.init_args == [7, 4, 2.0]
    assert torch.equal(load_model(again).make_inputs(3)[0], load_model(spec).make_inputs(3)[0])


def test_init_args_forms():
    assert parse_init_args("[256, 4, true, null]") == [256, 4, True, None]
    assert parse_init_args("256, 4, True, 1e-5, 'gelu', relu") == [256, 4, True, 1e-5, "gelu", "relu"]
    with pytest.raises(UsageError, match="JSON"):
        parse_init_args("[1, 2")


@pytest.mark.parametrize("options, message", [
    ({"input_dtype": "tokens"}, "--vocab-size"),
    ({"input_shape": "1,zero"}, "not a shape"),
    ({"dtype": "float8"}, "--dtype 'float8' is not one of"),
    ({"device": "tpu"}, "tpu"),
])
def test_bad_options_say_what_to_fix(tmp_path, options, message):
    with pytest.raises(UserError, match=message) as e:
        spec_from_options(write(tmp_path, TINY), **options)
    assert e.value.hint


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-GPU message")
def test_cuda_without_a_gpu_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no usable CUDA device"):
        spec_from_options(write(tmp_path, TINY), device="cuda")


def test_syntax_error_shows_the_users_file_and_line(tmp_path):
    path = write(tmp_path, "import torch\n\nclass Model(torch.nn.Module)\n    pass\n", "broken.py")
    with pytest.raises(UserError) as e:
        load_model(cpu_spec(path))
    assert f"{path}:3: syntax error" in e.value.message
    assert "class Model(torch.nn.Module)" in e.value.message  # the offending line itself


@pytest.mark.parametrize("body, line, where", [
    ("import torch\nx = 1\nraise RuntimeError('no config found')\n", 3, "while importing"),
    ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.n = int('seven')\n    def forward(self, x):\n        return x\n"
     "def get_inputs():\n    return [torch.ones(2)]\n", 5, "Model.__init__"),
    ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x @ x\n"
     "def get_inputs():\n    return [torch.ones(2, 3)]\n", 4, "forward"),
    ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
     "def get_inputs():\n    return [torch.ones(2) / undefined_scale]\n", 6, "get_inputs"),
])
def test_exceptions_in_user_code_show_the_users_file_and_line(tmp_path, body, line, where):
    path = write(tmp_path, body, "user_model.py")
    with pytest.raises(UserError) as e:
        loaded = load_model(cpu_spec(path))
        loaded.forward(loaded.make_inputs(0))
    assert e.value.message.startswith(f"{path}:{line}: ")
    assert where in e.value.message
    assert "autokernel" not in e.value.message.split(" (")[0]  # not a frame of ours
    assert "AUTOKERNEL_DEBUG" in e.value.hint


def test_file_without_a_module_says_what_it_expected(tmp_path):
    path = write(tmp_path, "import torch\n\ndef helper(x):\n    return x\n", "plain.py")
    with pytest.raises(UsageError) as e:
        load_model(cpu_spec(path))
    assert "KernelBench-format file (class Model, get_inputs(), get_init_inputs())" in e.value.message
    assert "no nn.Module subclass" in e.value.message


def test_file_with_other_classes_suggests_class_name(tmp_path):
    path = write(tmp_path, TINY)
    with pytest.raises(UsageError) as e:
        load_model(cpu_spec(path))
    assert "found nn.Module classes: Block, TokenNet" in e.value.message
    assert "--class-name TokenNet" in e.value.hint
    with pytest.raises(UsageError, match="class named Missing"):
        load_model(cpu_spec(path, class_name="Missing"))


def test_class_without_inputs_asks_for_input_shape(tmp_path):
    with pytest.raises(UsageError, match="--input-shape"):
        load_model(cpu_spec(write(tmp_path, TINY), class_name="Block", init_args="[4]"))


def test_missing_file():
    with pytest.raises(UserError, match="not found"):
        load_model(ModelSpec(path="/nonexistent/model.py"))


def test_model_options_decorator_adds_the_shared_options(tmp_path):
    app = typer.Typer()
    seen = {}

    @app.command()
    @model_options
    def show(model: Path, verbose: bool = typer.Option(False, "--verbose"), model_opts: ModelOptions = None):
        seen["spec"], seen["verbose"] = model_opts.spec(model), verbose

    path = write(tmp_path, TINY)
    result = CliRunner().invoke(app, [str(path), "--class-name", "TokenNet", "--input-shape", "1,4",
                                      "--input-dtype", "tokens", "--vocab-size", "9", "--init-args", "9, 4",
                                      "--dtype", "fp16", "--device", "cpu", "--verbose"])
    assert result.exit_code == 0, result.output
    spec = seen["spec"]
    assert (spec.class_name, spec.input_shape, spec.input_dtype, spec.vocab_size, spec.init_args, spec.dtype,
            spec.device) == ("TokenNet", [1, 4], "tokens", 9, [9, 4], "float16", "cpu")
    assert seen["verbose"] is True
    for flag in ("--class-name", "--input-shape", "--input-dtype", "--vocab-size", "--init-args", "--dtype",
                 "--device"):
        assert flag in CliRunner().invoke(app, ["--help"], terminal_width=200).output
