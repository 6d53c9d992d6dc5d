"""The static check before import: each rule refuses its construct with the line (every honest
kernel passing is tests/harness/isolation/test_surface_corpus.py)."""
from __future__ import annotations


import pytest

from harness.isolation.static_check import check_source, describe
from paths import ROOT

def _rules(text: str, **kw) -> list[tuple[int, str]]:
    return [(v.line, v.rule) for v in check_source(text, **kw)]


@pytest.mark.parametrize("text, want", [
    ("import os\n", [(1, "import not allowed")]),
    ("import numpy as np\n", [(1, "import not allowed")]),
    ("from math import *\n", [(1, "import not allowed")]),
    ("from . import x\n", [(1, "import not allowed")]),
    ("import torch.nn\n", [(1, "import not allowed")]),  # a kernel is not a module: torch.nn is for ModelNew
    ("\nimport harness.cuda_build\n", [(2, "import not allowed")]),  # only CUDA files use the loader
    ("import torch\nimport triton\n\ntriton.runtime.autotuner.time.perf_counter = None\n",
     [(4, "assignment to a module attribute"), (4, "attribute store"), (4, "not on the kernel allow-list")]),
    ("import torch\ntorch.cuda.Event = object\n",
     [(2, "assignment to a module attribute"), (2, "attribute store"), (2, "not on the kernel allow-list")]),
    ("import torch\ndef f():\n    torch.x.y = 1\n",
     [(3, "assignment to a module attribute"), (3, "attribute store"), (3, "not on the kernel allow-list")]),
    ("import torch\ndel torch.matmul\n", [(2, "assignment to a module attribute"), (2, "attribute store"),
                                         (2, "not on the kernel allow-list")]),
    ("import torch\ntorch.cuda.synchronize += 1\n", [(2, "assignment to a module attribute"), (2, "attribute store")]),
    ("import torch\nx = torch.os\n", [(2, "not on the kernel allow-list")]),
    ("def f(g):\n    return g.__globals__\n", [(2, "private name")]),
    ("x = __builtins__\n", [(1, "private name")]),
    ("exec('1')\n", [(1, "not on the kernel allow-list")]),
    ("eval('1')\n", [(1, "not on the kernel allow-list")]),
    ("compile('1', 'f', 'exec')\n", [(1, "not on the kernel allow-list")]),
    ("open('/tmp/x', 'w')\n", [(1, "not on the kernel allow-list")]),
    ("__import__('os')\n", [(1, "private name")]),
    ("class A: pass\nsetattr(A, 'x', 1)\n", [(2, "formatting")]),
    ("import math\ny = getattr(math, 'pi')\n", [(2, "formatting"), (2, "module used as a value")]),
    ("def f(o, n):\n    return getattr(o, n)\n", [(2, "formatting")]),
    ("def f(o):\n    return hasattr(o, '__dict__')\n", [(2, "private name")]),
    ("def f(o, n):\n    return hasattr(o, n)\n", [(2, "hasattr with a computed name")]),
    ("def f(o):\n    return type(o).__subclasses__()\n", [(2, "formatting"), (2, "private name")]),
    # the primitive of four lying kernels: a storage's native file write, reached from a tensor
    ("def f(b):\n    b._typed_storage()._untyped_storage._write_file(3, True, False, 1)\n",
     [(2, "private name")] * 3),
    ("def f(x):\n    x.apply_(lambda v: v * 2)\n", [(2, "host compute")]),
    ("def f(x):\n    return x.tolist()\n", [(2, "host compute")]),
    ("def f(x):\n    return x.softmax(-1)\n", [(2, "not on the kernel allow-list")]),
    ("import math\nx = math.e\ny = vars()\n", [(3, "formatting")]),
])
def test_each_rule_refuses_with_its_line(text, want):
    assert _rules(text) == want


def test_honest_constructs_pass():
    text = ("from __future__ import annotations\nimport math\nfrom typing import Optional\n"
            "import torch\nimport triton\nimport triton.language as tl\n"
            "from triton.language.extra import libdevice\n\n"
            "class Cfg:\n    block: int = 64\n    def __init__(self, n):\n        self.n = n\n"
            "def kernel_fn(x):\n    y = torch.empty_like(x)\n    n = hasattr(x, 'shape') and x.shape[-1]\n"
            "    cfg = Cfg(n)\n    parts = []\n    parts.append(cfg.n)\n    f = torch.empty\n    return y\n")
    assert check_source(text) == []


def test_cuda_and_model_profiles():
    cuda = "from harness.cuda_launcher import dtype_code, load_launcher\nfrom harness.cuda_build import load_cuda\n"
    assert check_source(cuda, "cuda") == [] and _rules(cuda, backend="triton") == [(1, "import not allowed")] * 2 + [
        (2, "import not allowed")]
    model = ("import torch.nn as nn\nimport torch.nn.functional as F\n"
             "from torch.utils.cpp_extension import load_inline\n")
    assert check_source(model, model=True) == []
    assert {r for _, r in _rules(model)} == {"import not allowed"}


def test_the_message_names_the_file_line_and_rule():
    text = "import torch\n\ntorch.cuda.Event = object\n"
    msg = describe(check_source(text), "exp_0001.py")
    assert "exp_0001.py:3: assignment to a module attribute: torch.cuda.Event" in msg
    assert "playbook/rules.md" in msg


@pytest.mark.parametrize("text, why", [
    # what no judgement needs and a winner would carry into the user's process
    ("import torch\ndef f(p):\n    return torch.serialization.pickle.loads(p)\n", "torch.serialization"),
    ("from torch import load\n", "torch.load"),
    ("import torch\ntorch.save({}, 'x')\n", "torch.save"),
    ("import torch\nx = torch._C\n", "torch._C is not among"),
    ("import torch\ntorch.library.Library('k', 'DEF')\n", "torch.library"),
    ("import torch\nf = torch.ops.aten.add\n", "torch.ops"),
    ("import torch\ntorch.hub.load('a', 'b')\n", "torch.hub"),
    ("import torch\ntorch.multiprocessing.Process\n", "torch.multiprocessing"),
    ("import torch\ntorch.compile(lambda x: x)\n", "torch.compile"),
    ("import torch\ntorch.jit.script\n", "torch.jit"),
    ("import torch\ntorch.cuda.Stream()\n", "torch.cuda.Stream"),
    ("import torch\ntorch.cuda.CUDAGraph()\n", "torch.cuda.CUDAGraph"),
    ("import torch\ntorch.cuda.Event(enable_timing=True)\n", "torch.cuda.Event"),
    ("import triton\ntriton.knobs.cache.dir\n", "triton.knobs"),
    ("import triton\ntriton.testing.do_bench\n", "triton.testing"),
    ("import typing\ntyping.types.FunctionType\n", "typing.types"),
    ("import torch\ntorch.quasirandom.SobolEngine\n", "torch.quasirandom is not among"),  # in no list: a module
    ("import triton.language as tl\ntl.core._semantic\n", "triton.language.core is not among"),
    ("from torch.utils.cpp_extension import load\n", "torch.utils.cpp_extension.load"),
])
def test_the_allow_list_refuses_what_a_kernel_does_not_need(text, why):
    found = [v for v in check_source(text, model="cpp_extension" in text)
             if v.rule in ("not on the kernel allow-list", "private name")]
    assert found and why in found[0].detail, found


@pytest.mark.parametrize("text, rule", [
    ("import torch\nlib = torch\n", "module used as a value"),
    ("def f(x):\n    x.numpy().tofile('/tmp/out')\n", "host compute"),
    ("def f(x):\n    return x.__class__.__base__\n", "private name"),
    ("def f(x):\n    return x.__reduce_ex__(2)\n", "private name"),
    ("def f(x, s):\n    x.record_stream(s)\n", "not on the kernel allow-list"),
    ("def f(a, b):\n    a.wait_stream(b)\n", "not on the kernel allow-list"),
    ("import torch\nclass Lazy(torch.Tensor):\n    pass\n", "tensor subclass"),
    ("from torch import Tensor\nclass Lazy(Tensor):\n    pass\n", "tensor subclass"),
])
def test_no_chain_leaves_the_file_unchecked(text, rule):
    assert rule in {r for _, r in _rules(text)}


def test_what_kernels_use_stays_allowed():
    text = ("import torch\nimport triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n"
            "def kernel_fn(x):\n    p = torch.cuda.get_device_properties(x.device)\n"
            "    cap = torch.cuda.get_device_capability()\n    s = torch.cuda.current_stream().cuda_stream\n"
            "    y = torch.empty(x.shape, dtype=torch.float16, device=x.device)\n"
            "    n = triton.next_power_of_2(x.shape[-1]) * triton.cdiv(4, 2)\n    return y.view(-1)\n")
    assert check_source(text) == []
    model = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
             "from torch.utils.cpp_extension import load_inline\nclass ModelNew(nn.Module):\n"
             "    def __init__(self):\n        super().__init__()\n        self.lin = nn.Linear(4, 4)\n"
             "    def forward(self, x):\n        return F.relu(self.lin(x))\n")
    assert check_source(model, model=True) == []


def test_what_the_playbook_tells_the_model_is_the_allow_list():
    """rules.md holds the allow-list's own words (so the LLM's prompt, which carries rules.md, does
    too), and every code block of the playbook passes the check."""
    import re

    from harness.isolation import kernel_surface
    rules = (ROOT / "playbook" / "rules.md").read_text()
    block = re.search(r"<!-- surface: .*? -->\n(.*?)<!-- /surface -->", rules, re.S)
    assert block and block.group(1).strip() == kernel_surface.in_words().strip(), \
        "regenerate the block: python -m harness.isolation.kernel_surface"
    checked = 0
    for path in sorted((ROOT / "playbook").glob("*.md")):
        for code in re.findall(r"```python\n(.*?)```", path.read_text(), re.S):
            try:
                compile(code, path.name, "exec")
            except SyntaxError:
                continue  # a fragment with `...` in place of a parameter list
            assert check_source(code, "cuda" if "cuda_launcher" in code else "triton") == [], path.name
            checked += 1
    assert checked


CUDA_FILE = '''import torch
from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "softmax"
BACKEND = "cuda"
CUDA_KERNELS = r"""
#include "autokernel_cuda.cuh"
__global__ void copy_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
}
void softmax_launch(const void* x, void* y, int64_t n, cudaStream_t stream) {
  copy_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>((const float*)x, (float*)y, n);
  HOST_LINE
}
"""


def kernel_fn(x):
    y = torch.empty_like(x)
    load_launcher(CUDA_KERNELS, None).softmax_launch(x, y, x.numel(), None)
    return y
'''


@pytest.mark.parametrize("host_line, word", [
    ("float h[4]; cudaMemcpy(h, x, 16, cudaMemcpyDeviceToHost);", "cudaMemcpy"),
    ("float* h; cudaMallocHost(&h, 16);", "cudaMallocHost"),
    ("std::ofstream log(\"/tmp/x\");", "std::ofstream"),
], ids=["memcpy_to_host", "host_memory", "a_file"])
def test_the_cuda_host_side_only_launches(host_line, word):
    assert check_source(CUDA_FILE.replace("HOST_LINE", ""), "cuda") == []
    found = check_source(CUDA_FILE.replace("HOST_LINE", host_line), "cuda")
    assert any(v.rule == "CUDA host side" and word in v.detail and v.line == 14 for v in found), found


@pytest.mark.parametrize("source, word", [
    ("#include <fstream>\n", "fstream"),
    ("torch::Tensor f(torch::Tensor a) {\n  float s = a.item<float>();\n  return torch::softmax(a, 0);\n}\n", ".item"),
    ("torch::Tensor f(torch::Tensor a) {\n  return torch::softmax(a, 0);\n}\n", "torch::softmax"),
])
def test_a_modelnew_load_inline_source_is_held_to_it_too(source, word):
    text = ("import torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
            f"SRC = '''\n#include <torch/extension.h>\n{source}'''\n")
    found = check_source(text, model=True)
    assert any(v.rule == "CUDA host side" and word in v.detail for v in found), found


BACKWARD = '''import torch
import triton
KERNEL_TYPE = "rmsnorm"
MUTATES_GRAD_OUT = False
def kernel_fn(x, weight, eps=1e-6):
    return x.new_empty(x.shape)
def backward_fn(grad_out, out, x, weight, eps=1e-6):
    @@LINE@@
    return x.new_empty(x.shape), weight.new_empty(weight.shape)
'''


@pytest.mark.parametrize("line, rule", [
    ("s = float(grad_out)", "host compute"),  # grad_out is followed as a tensor, as x is in kernel_fn
    ("s = float(out)", "host compute"),
    ("s = [v for v in x]", "host compute"),
    ("s = grad_out.tolist()", "host compute"),
    ("s = torch.softmax(out, -1)", "not on the kernel allow-list"),
    ("s = grad_out._base", "private name"),
])
def test_a_backward_is_held_to_the_same_surface(line, rule):
    """The backward's contract names pass; what it may not do is refused as in kernel_fn."""
    assert _rules(BACKWARD.replace("@@LINE@@", "s = grad_out.shape")) == []
    assert (8, rule) in _rules(BACKWARD.replace("@@LINE@@", line))


@pytest.mark.parametrize("text, rule, line", [
    # text: a tensor's repr reads every value with torch's dispatch modes off; a format string walks attributes
    ('def f(x):\n    return "{!r}".format(x)\n', "formatting", 2),
    ('def f(x):\n    return "{0.__globals__}".format_map({"a": x})\n', "formatting", 2),
    ("def f(x):\n    return repr(x)\n", "formatting", 2),
    ("def f(x):\n    return str(x)\n", "formatting", 2),
    ("def f(x):\n    return '%r' % (x,)\n", "formatting", 2),
    ("def f(x):\n    fmt = '%s'\n    return fmt % (x,)\n", "formatting", 3),
    ('def f(x):\n    return f"{x.shape!r}"\n', "formatting", 2),
    ('def f(x):\n    return f"{x.shape[0]:>8}"\n', "formatting", 2),
    ("def f(x):\n    print(x.shape)\n", "formatting", 2),
    ('import torch\ndef f(x):\n    return f"{torch.os}"\n', "not on the kernel allow-list", 3),  # braces are code
    # state: what one call leaves for the next
    ("n = 0\ndef f(x):\n    global n\n    n += 1\n", "state", 3),
    ("S = {'calls': 0}\ndef f(x):\n    S['calls'] += 1\n", "state", 3),
    ("L = []\ndef f(x):\n    L.append(1)\n", "state", 3),
    ("L = []\ndef f(x):\n    v = L\n", "state", 3),
    ("L = []\ndef g(v):\n    v.append(1)\ndef f(x):\n    g(L)\n", "state", 3),
    ("T = {'a': [1]}\ndef f(x):\n    return T['a']\n", "state", 3),
    ("def f(x, acc=[]):\n    return acc\n", "state", 1),
    ("def f(x):\n    c = [0]\n    def g():\n        c[0] += 1\n    return g\n", "state", 4),
    ("class C:\n    seen = []\n", "state", 2),
    ("class C:\n    pass\nOBJ = C()\n", "state", 3),
    ("import torch\nBUF = torch.zeros(1)\n", "state", 2),
    ("IT = map(abs, range(9))\n", "state", 1),
    ("def f(x):\n    yield x\n", "state", 2),
    # attribute stores: only self.<name> in __init__
    ("import torch\nT = torch.Tensor\nT.detach = None\n", "attribute store", 3),
    ("class C:\n    def __init__(self):\n        self.n = 0\n    def bump(self):\n        self.n += 1\n",
     "attribute store", 5),
])
def test_text_state_and_attribute_store_rules_refuse_with_their_line(text, rule, line):
    assert (line, rule) in _rules(text), _rules(text)


def test_what_those_rules_leave_to_a_kernel():
    text = ("CONFIG = {'BLOCK': 64}\nSIZES = (16, 32)\nclass Plan:\n    def __init__(self, n):\n        self.n = n\n"
            "def helper(n: int, block: int):\n    block //= 2\n    return Plan(n + block).n\n"
            "def kernel_fn(x):\n    grid = []\n    grid.append(x.shape[0])\n    opts = dict(CONFIG)\n"
            "    opts.update(num_warps=4)\n    seen = {}\n    seen[0] = len(CONFIG)\n    for b in SIZES:\n"
            "        grid.append(b)\n    y = x.new_empty(x.shape)\n    y[0] = 0\n"
            "    n = helper(x.shape[-1], CONFIG['BLOCK'])\n    print('rows', 1)\n"
            "    return f\"{n} rows\", y\n")
    assert check_source(text) == []


def test_annotations_that_only_name_builtin_types_are_not_code_to_refuse():
    # `prefix: str = ""` reads no value (the matmul starter's tile helper has one); an annotation
    # that calls something is code and is checked as code
    assert check_source('def f(x, prefix: str = "", n: int | None = None) -> tuple[int, int]:\n    return 1, 2\n') == []
    assert ("formatting" in {v.rule for v in check_source("def f(x, p: str(x) = 1):\n    return 1\n")})
