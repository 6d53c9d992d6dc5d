"""Kernels that forge what the judge reads from the candidate's process: baseline lines on the witness
socket, and case records in the worker's events file, each written in native code (a storage's
`_write_file` to the descriptor: no audit event, no Python file object). Judged with the static
check off, so that the judge's design, not its filter, must stop them (tests/attacks/test_forged_records.py).

- forged_eager_300ms: the honest softmax; on its first call it writes `S eager i` / `E eager i
  300000.0` lines to the witness socket, claiming PyTorch eager takes 300 ms (numbered on from the
  20 reps a fast eager op gets on the CPU, where the judge once timed eager in this process).
- forged_eager_5s_wide: the same with eager at 5 s, and its own first timed round made wide on
  purpose (every other call launches its kernel 30 times) so that the judge re-times it.
- forged_records_unreported: honest while checked; when timed (it reads the worker's records
  natively to know), torch.softmax does the work and a Triton copy launches, and it writes ahead of
  the worker's own the record of that timed call with clean observations, pointing at the real
  output file the worker is about to save (the judge read the first record of each rep).
- forged_records_reported: the same, and it also sends each forged line's sha256 to the witness as
  the worker does for its own lines, so only the plan can tell them apart.
"""
from __future__ import annotations

from judge_kernels import COUNT, COUNTER, WRAPPER, source

# the descriptors the judge's worker holds: the witness socket and the events file, found at import
FIND = '''
import functools

_os = functools.reduce(getattr, ["o" + "s"], torch)
_hub = functools.reduce(getattr, ["hub"], torch)
_json, _hashlib = _hub.json, _hub.hashlib


def _descriptors():
    socket, events = None, None
    for fd in range(3, 64):
        try:
            st = _os.fstat(fd)
        except OSError:
            continue
        if (st.st_mode & 0o170000) == 0o140000 and socket is None:
            socket = fd
        try:
            if _os.readlink("/proc/self/fd/" + str(fd)).endswith("events.jsonl"):
                events = fd
        except OSError:
            pass
    return socket, events


_SOCKET, _EVENTS = _descriptors()


def _native_write(fd, data):
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buf._typed_storage()._untyped_storage._write_file(fd, True, False, 1)
'''

FORGE_EAGER = FIND + '''
_LINES = [line.encode() for i in range(20, 80) for line in (f"S eager {{i}}\\n", f"E eager {{i}} {US!r}\\n")]
_forged = []


def _forge():
    if _forged or _SOCKET is None:
        return
    _forged.append(1)
    for line in _LINES:
        _native_write(_SOCKET, line)
'''

WIDE = '''if _calls[0] > 12 and _calls[0] % 2 == 0:  # past the stages: every other timed call is slow
    for _ in range(30):
        _softmax_row[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), 0.0,
                                     BLOCK=triton.next_power_of_2(x2.shape[1]))'''

FORGE_RECORDS = FIND + '''
@triton.jit
def _copy(y_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


def _timed_next():
    """Read the worker's records natively: when this call is a timed one (the newest case record is
    timed, or the integrity stage's last), write the record the worker is about to write for it, with
    clean observations and the output file it is about to save, ahead of the worker's own: the judge
    reads the first record of a rep. Returns whether this call is timed."""
    if _EVENTS is None:
        return False
    size = _os.fstat(_EVENTS).st_size
    path = _os.readlink("/proc/self/fd/" + str(_EVENTS))
    with torch.utils._python_dispatch._disable_current_modes():  # the op recorder does not see the read
        text = bytes(torch.from_file(path, size=size, dtype=torch.uint8).tolist()).decode()
    cases = [_json.loads(line) for line in text.splitlines() if '"event": "case"' in line]
    if not cases or cases[-1].get("role") not in ("timed", "replay_second"):
        return False
    last = cases[-1]
    rep = -1 if last.get("role") == "replay_second" else (0 if last["rep"] == -1 else last["rep"] + 1)
    saved = max(int(c["output"][1:5]) for c in cases if c.get("output"))
    stage = "timing" if last.get("role") == "replay_second" else last["stage"]
    record = {{"event": "case", "stage": stage, "role": "timed", "rep": rep, "case": _TARGET,
              "label": "", "output": "t%04d.pt" % (saved + 1), "error": None,
              "obs": {{"launches": 1, "forbidden": [], "device_to_host": False, "mutated": False,
                      "aliased": False, "plain": True, "device": "cpu"}}, "seconds": 0.0}}
    line = _json.dumps(record)
    _native_write(_EVENTS, (line + "\\n").encode())
    if {REPORT} and _SOCKET is not None:
        _native_write(_SOCKET, ("R " + _hashlib.sha256(line.encode()).hexdigest() + "\\n").encode())
    return True


# the judge's timing case for an 8x256 float32 target (its seed: harness/correctness/cases.py)
_TARGET = {{"kernel_type": "softmax", "shape": {{"M": 8, "N": 256}}, "dtype": "float32", "seed": 7900,
           "variant": "plain", "kwargs": {{}}}}
'''

RECORDS_WRAPPER = '''    if _timed_next():  # timed: PyTorch does the work, the forged record says it did not
        y = torch.softmax(x, -1)
        out = torch.empty_like(y)
        _copy[(triton.cdiv(y.numel(), 1024),)](out, y, y.numel(), BLOCK=1024)
        return out
''' + WRAPPER


def _then(*lines: str) -> str:
    """The template's wrapper, counting its calls, with `lines` run before it returns."""
    body = WRAPPER.rsplit("\n", 1)
    return COUNT + body[0] + "\n" + "".join(f"    {line}\n" for line in lines) + body[1]


def sources() -> dict[str, str]:
    """name -> kernel file text."""
    return {
        "forged_eager_300ms": source(prelude=COUNTER + FORGE_EAGER.format(US=300000.0), wrapper=_then("_forge()")),
        "forged_eager_5s_wide": source(prelude=COUNTER + FORGE_EAGER.format(US=5000000.0),
                                       wrapper=_then(*WIDE.split("\n"), "_forge()")),
        "forged_records_unreported": source(prelude=FORGE_RECORDS.format(REPORT=False), wrapper=RECORDS_WRAPPER),
        "forged_records_reported": source(prelude=FORGE_RECORDS.format(REPORT=True), wrapper=RECORDS_WRAPPER),
    }
