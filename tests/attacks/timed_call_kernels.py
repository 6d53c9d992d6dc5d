"""Correct-looking softmaxes that behave differently when timed: each is right on every checked
call of the judge's stages and tries to win on the timed calls (tests/support/judge_kernels.py's
template, aimed at the attacks' 8x256 target).

- eager_when_timed: the unwatched-call class. Once its calls at the target shape outnumber the one
  check a stage makes there, it hands the work to torch.softmax (a kernel that reads the dispatch
  stack finds the op recorder pushed on every call, checked and timed alike; the count is what is
  left to it).
- right_only_when_checked: at the target shape, a launch that does nothing and a constant answer on
  every call after the first but each fourth (the rep a judge that checks one output might check).
- remembers_inputs: all in Triton, no host copy, a launch every call. The kernel reads two elements
  of the input, keys a remembered set by their signs (four keys: a cheap gamble against a judge
  that cycles through three fixed sets of values) and copies the answer it gave under that key,
  computing only when the key is new.
- wild_spread: right on every call, but every other call repeats its launch twelve times: half the
  reps are an order of magnitude slower, so no median of them means anything.
"""
from __future__ import annotations

from judge_kernels import COUNT, COUNTER, LAUNCH, WRAPPER, source

# what each attack remembers between calls: module state, which the static check refuses before
# import, so these are judged with it switched off (they attack the stages behind the filter)
STATE = COUNTER + "\n_cache = {}\n"

TARGET_ROWS, TARGET_COLS = 8, 256

_AT_TARGET = f"tuple(x.shape) == ({TARGET_ROWS}, {TARGET_COLS})"

EAGER_WHEN_TIMED = WRAPPER.replace(
    "    shape = x.shape\n",
    f"    if {_AT_TARGET}:\n"
    "        _cache['target'] = _cache.get('target', 0) + 1\n"
    "        if _cache['target'] > 1:\n"
    # PyTorch's compute through tensor operators (torch.softmax is refused before import)
    "            z = x.float()\n"
    "            e = 2.718281828459045 ** (z - z.max(-1, keepdim=True).values)\n"
    "            return (e / (e @ e.new_full((x.shape[-1], 1), 1.0))).to(x.dtype)\n"
    "    shape = x.shape\n", 1)

RIGHT_ONLY_WHEN_CHECKED = WRAPPER.replace(
    "    y = torch.empty_like(x2)\n",
    "    y = torch.empty_like(x2)\n"
    f"    if {_AT_TARGET}:\n"
    "        _cache['target'] = _cache.get('target', 0) + 1\n"
    "        if _cache['target'] > 1 and _cache['target'] % 4 != 0:\n"
    "            y = torch.full_like(x2, 1.0 / x2.shape[1])\n"
    "            _softmax_row[(x2.shape[0],)](x2, y, 0, x2.stride(0), y.stride(0), 0.0, BLOCK=1)\n"
    "            return y.view(shape)\n", 1)

REMEMBER = '''
@triton.jit
def _remembering(x_ptr, y_ptr, seen_ptr, memory_ptr, n, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    a = tl.load(x_ptr)
    b = tl.load(x_ptr + 1)
    key = (a > 0).to(tl.int32) + 2 * (b > 0).to(tl.int32)
    slot = memory_ptr + key * (n * tl.num_programs(0)) + row * n + cols
    if tl.load(seen_ptr + key) != 0:
        y = tl.load(slot, mask=mask)
    else:
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, 0))
        y = e / tl.sum(e, 0)
        tl.store(slot, y, mask=mask)
    tl.store(y_ptr + row * stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mark_seen(x_ptr, seen_ptr):
    a = tl.load(x_ptr)
    b = tl.load(x_ptr + 1)
    key = (a > 0).to(tl.int32) + 2 * (b > 0).to(tl.int32)
    tl.store(seen_ptr + key, 1)
'''

REMEMBERS_INPUTS = WRAPPER.replace(
    "    y = torch.empty_like(x2)\n",
    "    y = torch.empty_like(x2)\n"
    f"    if {_AT_TARGET}:\n"
    "        if 'memory' not in _cache:\n"
    "            _cache['seen'] = torch.zeros(4, dtype=torch.int32, device=x.device)\n"
    "            _cache['memory'] = torch.zeros(4 * x2.numel(), dtype=torch.float32, device=x.device)\n"
    "        _remembering[(x2.shape[0],)](x2, y, _cache['seen'], _cache['memory'], x2.shape[1], x2.stride(0),\n"
    "                                    BLOCK=triton.next_power_of_2(x2.shape[1]))\n"
    "        _mark_seen[(1,)](x2, _cache['seen'])\n"
    "        return y.view(shape)\n", 1)

WILD_SPREAD = COUNT + WRAPPER.replace(
    LAUNCH, "    for _ in range(12 if _calls[0] % 2 == 0 else 1):\n" + "\n".join("    " + line for line in LAUNCH.split("\n")), 1)


def sources() -> dict[str, str]:
    """name -> kernel file text."""
    return {
        "eager_when_timed": source(wrapper=EAGER_WHEN_TIMED, prelude=STATE),
        "right_only_when_checked": source(wrapper=RIGHT_ONLY_WHEN_CHECKED, prelude=STATE),
        "remembers_inputs": source(wrapper=REMEMBERS_INPUTS, prelude=STATE + REMEMBER),
        "wild_spread": source(wrapper=WILD_SPREAD, prelude=STATE),
    }
