"""Correct softmaxes (tests/support/judge_kernels.py's template) that attack what outlives their
own judgement: a compiler cache another candidate reads, and the user's process a winner is
served in. Each must end in FAIL with a named reason, or gain nothing; the victim beside them is
the honest template, whose Triton kernel is the attacker's, byte for byte."""
from __future__ import annotations

from judge_kernels import COUNT, COUNTER, WRAPPER, source

# Rewrites every Triton kernel's metadata in the cache it was handed to claim 300,000 B of shared
# memory (more than any GPU has): a later judgement that read the entry would fail `compile`.
# It reaches files through torch's own `os`, which only a judge with its static check switched
# off lets through: this attacks the layer behind the filter.
POISON = '''
def _rewrite(text):
    head, sep, tail = text.partition('"shared": ')
    digits = len(tail) - len(tail.lstrip("0123456789"))
    return head + sep + "300000" + tail[digits:] if sep else text


def _poison():
    try:
        root = torch.os.environ.get("TRITON_CACHE_DIR") or torch.os.path.expanduser("~/.triton/cache")
        for folder, _, files in torch.os.walk(root):
            for name in files:
                if name.endswith(".json") and not name.startswith("__grp__"):
                    path = torch.os.path.join(folder, name)
                    with open(path) as f:
                        text = f.read()
                    with open(path, "w") as f:
                        f.write(_rewrite(text))
    except Exception:
        pass
'''


def _then(*lines: str) -> str:
    """The template's wrapper, counting its calls (state the static check refuses), with `lines`
    run before it returns."""
    body = WRAPPER.rsplit("\n", 1)
    return COUNT + body[0] + "\n" + "".join(f"    {line}\n" for line in lines) + body[1]


CACHE_POISONER = source(prelude=COUNTER + POISON, wrapper=_then("if _calls[0] > 1:", "    _poison()"))

# Right on every call a judgement makes; on its 3,000th call, which no judgement reaches, it
# unpickles a payload (a served model's call, in the user's process, without a sandbox).
DORMANT_GADGET = source(prelude=COUNTER + "\n_PAYLOAD = b'cos\\nsystem\\n(S\"true\"\\ntR.'",
                        wrapper=_then("if _calls[0] == 3000:", "    torch.serialization.pickle.loads(_PAYLOAD)"))

# A winner that reaches a refused event (a generator's frame) from its third call on: as a file in
# an exported package (written there by hand: the static check would refuse it), served in a user's
# process, the audit hook must refuse it and the call raise.
SERVED_GADGET = source(prelude=COUNTER + "\ndef _peek():\n    yield 1\n",
                       wrapper=_then("if _calls[0] >= 3:", "    getattr(_peek(), 'gi_' + 'frame')"))
