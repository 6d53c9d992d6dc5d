"""Kernel files that reach outside a kernel's business through the interpreter's back doors, each
refused by the static check before import with the rule named beside it; and, for each rule, the
honest construct next to it that must stay allowed.

- a builtin function's module (`getattr(len, "__self__")` is the builtins module), then `vars` of it,
  `__import__` under a computed key and `sys.modules`: the op recorder emptied from inside a call;
- `hasattr(obj, "__wrapped__")`: telling the judge's watched launches from a user's;
- `object.__setattr__` on a frozen dataclass of the judge, `exec` in a thread of its own;
- the softmax computed by numpy or on Python lists, out of sight of what a call did with PyTorch;
- a weak reference's callback, a `__del__` or a generator's cleanup: work run when the judge drops
  an object, outside the timed region.
"""
from __future__ import annotations

HEADER = '''import typing

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"
CONFIG = {"BLOCK": 16}


@triton.jit
def _noop(y_ptr, BLOCK: tl.constexpr):
    pass

'''


def _kernel(prelude: str, *body: str) -> str:
    """A kernel file: `prelude` at module level, then kernel_fn running `body` and a token launch."""
    lines = "".join(f"    {line}\n" for line in body)
    return f'{HEADER}{prelude}\n\ndef kernel_fn(x):\n{lines}    _noop[(1,)](x, BLOCK=CONFIG["BLOCK"])\n    return y\n'


# name -> (kernel file text, the rule that refuses it, a word its detail names)
ATTACKS = {
    "builtins_through_self": (_kernel(
        '_b = getattr(len, "__self__")\n_imp = getattr(_b, "vars")(_b)["__imp" + "ort__"]\n'
        '_pd = getattr(_imp("sy" + "s"), "modules")["torch.utils._python_dispatch"]',
        "y = x.float().softmax(-1).to(x.dtype)",
        'getattr(getattr(_pd, "_get_current_dispatch_mode")(), "forbidden").clear()'),
        "formatting", "getattr"),  # getattr is never a kernel's (it was held to the rules of a dot)
    "vars_by_literal_name": (_kernel("_v = getattr(print, 'vars', None)", "y = x.softmax(-1)"),
                             "formatting", "getattr"),
    "getattr_passed_along": (_kernel('_b = functools.reduce(getattr, ["__self__"], len)', "y = x.softmax(-1)"),
                             "formatting", "getattr"),
    "judge_detect_wrapped": (_kernel("", 'judged = hasattr(type(_noop).run, "__wrapped__")',
                                     "y = x.softmax(-1) * (1.0 if judged else 1.01)"),
                             "private name", "__wrapped__"),
    "frozen_field_rebound": (_kernel('getattr(object, "__setattr__")(CONFIG, "reference", None)',
                                     "y = x.softmax(-1)"), "formatting", "getattr"),
    "exec_in_a_thread": (_kernel("import threading\n_t = threading.Thread(target=getattr(print, \"exec\"), args=(\"\",))",
                                 "y = x.softmax(-1)"), "import not allowed", "threading"),
    "numpy_compute": (_kernel("", "a = x.double().numpy()", "e = 2.718281828459045 ** (a - a.max(-1, keepdims=True))",
                              "y = torch.from_numpy(e / e.sum(-1, keepdims=True)).to(x.dtype)"),
                      "host compute", "numpy"),
    "python_list_compute": (_kernel("", "rows = [[v * 1.0 for v in r] for r in x.tolist()]",
                                    "y = torch.tensor(rows, dtype=x.dtype)"), "host compute", "tolist"),
    "storage_bytes": (_kernel("", "raw = bytes(x.contiguous().untyped_storage())", "y = x.softmax(-1)"),
                      "host compute", "untyped_storage"),
    "from_buffer": (_kernel("", "y = torch.frombuffer(bytearray(x.numel() * 4), dtype=torch.float32)"),
                    "not on the kernel allow-list", "frombuffer"),
    "weak_reference_callback": (_kernel("import torch.utils.weak\n_ready = {}",
                                        "y = x.softmax(-1)",
                                        "torch.utils.weak.WeakIdRef(y, lambda ref: _ready.update(n=x.softmax(-1)))"),
                                "import not allowed", "torch.utils.weak"),
    "finalizer_method": (_kernel("class _Later:\n    def __init__(self, x):\n        self.x = x\n\n"
                                 "    def __del__(self):\n        _ready.append(self.x.softmax(-1))\n\n\n_ready = []",
                                 "y = _ready.pop() if _ready else x.softmax(-1)", "_Later(x)"),
                         "finalizer", "__del__"),
    "generator_cleanup": (_kernel("_ready = []\n\n\ndef _later(x):\n    try:\n        yield\n    finally:\n"
                                 "        _ready.append(x.softmax(-1))\n\n\n_held = []",
                                 "y = x.softmax(-1)", "g = _later(x)", "next(g)", "_held[:] = [g]"),
                          "finalizer", "yield inside try"),
    "coroutine_cleanup": (_kernel("_ready = []\n\n\nasync def _later(x, wait):\n    try:\n        pass\n"
                                  "    except ValueError:\n        pass\n    else:\n        await wait\n    finally:\n"
                                  "        _ready.append(x.softmax(-1))", "y = x.softmax(-1)"),
                          "finalizer", "yield inside try"),
    "class_from_a_namespace": (_kernel('_Later = type("L", (), {"__d" + "el__": lambda self: None})',
                                       "y = x.softmax(-1)"), "formatting", "type"),
    "type_passed_along": (_kernel('_make = type\n_Later = _make("L", (), {})', "y = x.softmax(-1)"),
                          "formatting", "type"),
    "annotation_run_as_code": (_kernel('def _f(a: "getattr(len, \'__self__\')"):\n    pass\n\n\n'
                                       "_hints = typing.get_type_hints(_f)", "y = x.softmax(-1)"),
                               "not on the kernel allow-list", "get_type_hints"),
    # judged with its weight an nn.Parameter that requires grad; served inside a custom op, a frozen
    # layer or a compiled graph, another path
    "requires_grad_tell": (_kernel("", "y = torch.empty_like(x)",
                                   "scale = 1.0 if x.requires_grad else 1.01"), "judge tell", "requires_grad"),
    "requires_grad_by_hasattr": (_kernel("", "y = torch.empty_like(x)",
                                         'frozen = hasattr(x, "requires_grad")'), "judge tell", "requires_grad"),
    # judged on the CPU, served on a GPU
    "is_cuda_tell": (_kernel("", "y = torch.empty_like(x)", "scale = 1.01 if x.is_cuda else 1.0"),
                     "judge tell", "is_cuda"),
}

# modules that run code later or elsewhere: threads, signals, exit hooks, weak references
LATER_MODULES = ("weakref", "atexit", "signal", "threading", "_thread", "concurrent.futures", "torch.utils.weak")

# the honest constructs beside each rule: none of them may be refused
HONEST = _kernel(
    "class _Rows:\n    def __init__(self, n):\n        self.n = n\n\n    def items(self):\n"
    "        return list(range(self.n))\n",
    'block = x.shape[-1] if hasattr(x, "shape") else CONFIG["BLOCK"]',
    "kind = isinstance(x, torch.Tensor)",
    "rows = sum(1 for _ in _Rows(x.shape[0]).items())",
    "try:", "    cols = x.shape[1]", "except IndexError:", "    cols = 1", "finally:", "    rows += 0",
    "seen = {}", "seen[rows] = (x.shape, block)",
    "out = torch.empty(x.shape, dtype=x.dtype, device=x.device)",  # the device, to allocate on
    "y = torch.empty_like(x)")
