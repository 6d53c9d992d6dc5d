"""Loading the user's model: a KernelBench-format file or any nn.Module class.

A KernelBench file defines `Model`, `get_inputs()` and `get_init_inputs()` and is used as it is. Any
other file names its class with --class-name and describes its input with --input-shape,
--input-dtype (a float dtype, or `tokens` with --vocab-size) and --init-args. `--dtype` casts the
model and its float inputs; `--device` picks cuda or cpu.

A file may also declare a training step (autokernel.profile.training): `loss_fn(output, inputs)`,
the scalar loss of the model's output on its inputs, or `train_step(model, inputs)`, which runs the
forward and returns that loss; `get_optimizer(model)` may replace the default AdamW. A file that
declares one is profiled for training unless `--no-train` says otherwise; `--train` profiles any
model for training, with a default loss where one fits.

A `ModelSpec` is everything needed to load the same model again (runs store it in config.json and
`verify` reloads it). Errors in the user's own file are reported as that file and line, never as a
stack through autokernel.

Commands that take a model declare the options once, with `@model_options`:

    @app.command()
    @model_options
    def optimize(model: Path = typer.Argument(...), budget: str = "8h",
                 model_opts: ModelOptions = None) -> None:
        spec = model_opts.spec(model)     # a ModelSpec; load_model(spec) builds it
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import json
import sys
import traceback
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

from autokernel.errors import UsageError, UserError

# torch is imported inside the functions that build things: the CLI imports this module for its
# options, and `autokernel --help` should not wait for torch.
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
SHORT_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
TOKENS = "tokens"
LOSS_FN, TRAIN_STEP, GET_OPTIMIZER = "loss_fn", "train_step", "get_optimizer"  # a file's training step
DEBUG_HINT = "set AUTOKERNEL_DEBUG=1 to see the full traceback"


@dataclass
class ModelSpec:
    """Where the model is and how to build it and its inputs; JSON-serializable."""

    path: str
    class_name: Optional[str] = None
    input_shape: Optional[list[int]] = None
    input_dtype: Optional[str] = None  # a float dtype or "tokens"; None: float32 (or --dtype)
    vocab_size: Optional[int] = None
    init_args: Optional[list[Any]] = None  # None: get_init_inputs() if the file has it, else []
    dtype: Optional[str] = None  # cast the model and its float inputs; None: leave as built
    device: str = "cpu"
    train: Optional[bool] = None  # profile a training step; None: when the file declares one

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "ModelSpec":
        known = {f.name for f in fields(ModelSpec)}
        return ModelSpec(**{k: v for k, v in d.items() if k in known})


@dataclass
class LoadedModel:
    """A built model in eval mode on its device, and a seeded source of its inputs."""

    spec: ModelSpec
    model: Any  # torch.nn.Module
    module: Any  # the user's file as an imported module
    input_fn: Callable[[], list] = field(repr=False)

    def make_inputs(self, seed: int) -> list:
        """Fresh inputs, the same for the same seed."""
        import torch
        devices = [torch.device(self.spec.device)] if self.spec.device.startswith("cuda") else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            raw = _in_user_code(self.spec.path, "get_inputs()", self.input_fn)
        raw = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        return [self._place(x) for x in raw]

    @property
    def training(self) -> bool:
        """Whether the model is profiled for training: --train/--no-train, else its file's word."""
        if self.spec.train is not None:
            return self.spec.train
        return any(callable(getattr(self.module, name, None)) for name in (LOSS_FN, TRAIN_STEP))

    def forward(self, inputs: list) -> Any:
        """model(*inputs) without autograd; an error in the user's code becomes a UserError."""
        import torch
        with torch.no_grad():
            return _in_user_code(self.spec.path, "forward", lambda: self.model(*inputs))

    def _place(self, x: Any) -> Any:
        import torch
        if not isinstance(x, torch.Tensor):
            return x
        x = x.to(self.spec.device)
        if self.spec.dtype and x.is_floating_point():
            x = x.to(getattr(torch, self.spec.dtype))
        return x


# ---------------------------------------------------------------- options -> spec
def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_shape(text: str) -> list[int]:
    try:
        shape = [int(p) for p in text.replace("x", ",").split(",") if p.strip()]
    except ValueError:
        shape = []
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"--input-shape {text!r} is not a shape", "write positive sizes separated by commas, e.g. 1,512")
    return shape


def parse_init_args(text: str) -> list[Any]:
    """A JSON list (`[256, 4, true]`) or comma-separated Python literals (`256, 4, True`)."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError as e:
            raise UsageError(f"--init-args is not a JSON list: {e}", "e.g. --init-args '[256, 4]'") from e
        return value
    args = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            args.append(ast.literal_eval(part))
        except (ValueError, SyntaxError):
            args.append(part)  # a bare word is a string argument
    return args


def _dtype_name(text: Optional[str], option: str, allow_tokens: bool = False) -> Optional[str]:
    if text is None:
        return None
    name = SHORT_DTYPES.get(text, text)
    if name in FLOAT_DTYPES or (allow_tokens and name == TOKENS):
        return name
    choices = ", ".join(list(FLOAT_DTYPES) + ([TOKENS] if allow_tokens else []))
    raise UsageError(f"{option} {text!r} is not one of: {choices}", f"e.g. {option} float16")


def _device_name(text: Optional[str]) -> str:
    import torch
    device = text or default_device()
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise UsageError(f"--device {device!r} is not a device", "use cuda or cpu") from e
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r} is not supported", "use cuda or cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but this machine has no usable CUDA device",
                        "leave --device out (the CPU is used) or run on a machine with a GPU")
    return device


def spec_from_options(path: str | Path, class_name: Optional[str] = None, input_shape: Optional[str] = None,
                      input_dtype: Optional[str] = None, vocab_size: Optional[int] = None,
                      init_args: Optional[str] = None, dtype: Optional[str] = None,
                      device: Optional[str] = None, train: Optional[bool] = None) -> ModelSpec:
    """A ModelSpec from the command-line option values (strings as typed)."""
    in_dtype = _dtype_name(input_dtype, "--input-dtype", allow_tokens=True)
    if in_dtype == TOKENS and not vocab_size:
        raise UsageError("--input-dtype tokens needs --vocab-size", "e.g. --vocab-size 32000")
    return ModelSpec(path=str(path), class_name=class_name,
                     input_shape=parse_shape(input_shape) if input_shape else None,
                     input_dtype=in_dtype, vocab_size=vocab_size,
                     init_args=parse_init_args(init_args) if init_args is not None else None,
                     dtype=_dtype_name(dtype, "--dtype"), device=_device_name(device), train=train)


@dataclass
class ModelOptions:
    """The model options of a command, as typed; `.spec(path)` resolves them."""

    class_name: Optional[str] = None
    input_shape: Optional[str] = None
    input_dtype: Optional[str] = None
    vocab_size: Optional[int] = None
    init_args: Optional[str] = None
    dtype: Optional[str] = None
    device: Optional[str] = None
    train: Optional[bool] = None

    def spec(self, path: str | Path) -> ModelSpec:
        return spec_from_options(path, **asdict(self))


def _option_params() -> list[inspect.Parameter]:
    import typer  # only commands need it

    def opt(name: str, annotation: Any, help_text: str, flag: Optional[str] = None) -> inspect.Parameter:
        flag = flag or "--" + name.replace("_", "-")
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                 default=typer.Option(None, flag, help=help_text))
    return [
        opt("class_name", Optional[str], "The nn.Module class to build (default: KernelBench's Model)."),
        opt("input_shape", Optional[str], "Shape of the model's input, e.g. 1,512 (default: get_inputs())."),
        opt("input_dtype", Optional[str], "float32, float16, bfloat16, or tokens (needs --vocab-size)."),
        opt("vocab_size", Optional[int], "Token ids are drawn from [0, vocab-size)."),
        opt("init_args", Optional[str], "Constructor arguments: a JSON list or comma-separated literals."),
        opt("dtype", Optional[str], "Cast the model and its float inputs: float32, float16, bfloat16."),
        opt("device", Optional[str], "cuda or cpu (default: cuda if present)."),
        opt("train", Optional[bool], "Profile a training step: forward, backward and the optimizer step "
            "(default: when the file declares loss_fn or train_step).", "--train/--no-train"),
    ]


def model_options(command: Callable) -> Callable:
    """Decorator for a typer command: adds the eight model options and passes their values to the
    command as its `model_opts: ModelOptions` parameter."""
    # evaluated: under `from __future__ import annotations` they are strings that only resolve in
    # the command's own module, and typer will look them up from this wrapper's
    sig = inspect.signature(command, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "model_opts"]
    params = own + _option_params()
    names = [f.name for f in fields(ModelOptions)]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        opts = ModelOptions(**{n: kwargs.pop(n, None) for n in names})
        return command(*args, model_opts=opts, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # what typer reads
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # so inspect does not look through to the undecorated signature
    return wrapper


# ---------------------------------------------------------------- loading
def load_model(spec: ModelSpec) -> LoadedModel:
    """Import the user's file, build the model (seeded: two loads give the same weights), move it
    to the device, cast it, put it in eval mode, and check that its inputs can be made."""
    import torch
    path = Path(spec.path)
    if not path.is_file():
        raise UserError(f"model file {spec.path} not found", "pass the path of a .py file that defines the model")
    module = _import_user_file(path, spec.path)
    cls = _model_class(module, spec)
    init_args = spec.init_args
    if init_args is None:
        get_init = getattr(module, "get_init_inputs", None)
        init_args = list(_in_user_code(spec.path, "get_init_inputs()", get_init)) if callable(get_init) else []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _in_user_code(spec.path, f"{cls.__name__}.__init__", lambda: cls(*init_args))
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"{spec.path}: {cls.__name__}(...) did not build an nn.Module",
                        "--class-name must name a torch.nn.Module subclass")
    model = model.to(spec.device)
    if spec.dtype:
        model = model.to(getattr(torch, spec.dtype))
    return LoadedModel(spec=spec, model=model.eval(), module=module, input_fn=_input_fn(module, spec))


def _import_user_file(path: Path, shown: str) -> Any:
    name = f"autokernel_user_model_{abs(hash(str(path.resolve())))}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the user's file may import its neighbours
    sys.modules[name] = module  # dataclasses and pickling look classes up here
    try:
        mod_spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        where = f"{shown}:{e.lineno}" if e.lineno else shown
        line = f"\n    {e.text.rstrip()}" if e.text else ""
        raise UserError(f"{where}: syntax error: {e.msg}{line}", "fix the syntax of the model file") from e
    except Exception as e:
        sys.modules.pop(name, None)
        raise _user_code_error(e, shown, "while importing the file") from e
    return module


def _model_class(module: Any, spec: ModelSpec) -> type:
    import torch
    found = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, torch.nn.Module)
             and v.__module__ == module.__name__]
    wanted = spec.class_name or "Model"
    cls = getattr(module, wanted, None)
    if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
        return cls
    expected = (f"an nn.Module class named {wanted}" if spec.class_name else
                "a KernelBench-format file (class Model, get_inputs(), get_init_inputs()) or --class-name")
    if found:
        raise UsageError(f"{spec.path}: expected {expected}; found nn.Module classes: {', '.join(found)}",
                         f"pass --class-name {found[-1]} (plus --input-shape, and --input-dtype tokens "
                         "--vocab-size N for token inputs)")
    raise UsageError(f"{spec.path}: expected {expected}; the file defines no nn.Module subclass",
                     "point autokernel at the file that defines your model class")


def _input_fn(module: Any, spec: ModelSpec) -> Callable[[], list]:
    import torch
    if spec.input_shape:
        shape = tuple(spec.input_shape)
        if spec.input_dtype == TOKENS:
            return lambda: [torch.randint(0, spec.vocab_size, shape, dtype=torch.int64)]
        dtype = getattr(torch, spec.input_dtype or spec.dtype or "float32")
        return lambda: [torch.randn(shape, dtype=torch.float32).to(dtype)]
    get_inputs = getattr(module, "get_inputs", None)
    if not callable(get_inputs):
        raise UsageError(f"{spec.path} has no get_inputs() and no --input-shape was given",
                         "pass --input-shape, e.g. --input-shape 1,128 (and --input-dtype tokens "
                         "--vocab-size N for token ids)")
    return get_inputs


def _in_user_code(shown: str, what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise _user_code_error(e, shown, f"in {what}") from e


def _user_code_error(e: BaseException, shown: str, what: str) -> UserError:
    """`model.py:42: ValueError: ... (in forward)`: the deepest frame in the user's file."""
    target = str(Path(shown).resolve())
    frames = [f for f in traceback.extract_tb(e.__traceback__) if _same_file(f.filename, target)]
    where = f"{shown}:{frames[-1].lineno}" if frames else shown
    code = f"\n    {frames[-1].line}" if frames and frames[-1].line else ""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return UserError(f"{where}: {type(e).__name__}: {text} ({what}){code}",
                     f"fix the model file at that line; {DEBUG_HINT}")


def _same_file(a: str, b: str) -> bool:
    try:
        return str(Path(a).resolve()) == b
    except OSError:
        return False
