"""What the exported package's audit hook costs per served call (autokernel/deploy/kernel_package.py).

The hook runs on every audit event in the process; a served kernel call raises only a few. So the
cost per call is (events a call raises) x (the hook's cost per event), both measured here, in a
fresh process per figure, with the minimum over rounds (a busy machine only adds time):

    python benchmarks/serving_guard.py PACKAGE_PARENT     # a folder holding autokernel_kernels/

Prints one JSON object: ns per event with and without the hook (an event the hook ignores, and a
watched one it lets pass), the events one call of each kernel raises, and the product per call.
AUTOKERNEL_KERNEL_AUDIT=off is the switch the figure is compared against.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

PER_EVENT = r'''
import json, sys, time
import autokernel_kernels as ak
ak.winners()
def per_event(name, args, n=200000, rounds=7):
    best = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            sys.audit(name, *args)
        best.append((time.perf_counter() - t) / n * 1e9)
    return min(best)
print(json.dumps({"ignored_ns": per_event("autokernel.bench", ()),
                  "watched_ns": per_event("object.__getattr__", (per_event, "__name__"))}))
'''

EVENTS_PER_CALL = r'''
import json, sys, torch
import autokernel_kernels as ak
counts, on = {}, [False]
sys.addaudithook(lambda e, a: counts.__setitem__(e, counts.get(e, 0) + 1) if on[0] else None)
out = {}
for w in ak.winners():
    if w.kernel_type != "softmax":
        continue
    x = torch.randn(w.dims["M"], w.dims["N"], device="cuda" if torch.cuda.is_available() else "cpu")
    w.kernel_fn(x)  # the first call compiles
    counts.clear(); on[0] = True
    w.kernel_fn(x)
    on[0] = False
    out[w.target] = sum(counts.values())
print(json.dumps(out))
'''


def _run(code: str, parent: str, guard: str) -> dict:
    env = {**os.environ, "PYTHONPATH": parent, "AUTOKERNEL_KERNEL_AUDIT": guard}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(parent: str) -> dict:
    on, off = _run(PER_EVENT, parent, "on"), _run(PER_EVENT, parent, "off")
    events = _run(EVENTS_PER_CALL, parent, "off")
    extra_ns = max(on["watched_ns"] - off["watched_ns"], on["ignored_ns"] - off["ignored_ns"], 0.0)
    return {"hook_on_ns_per_event": on, "hook_off_ns_per_event": off, "events_per_call": events,
            "added_ns_per_call_at_most": {t: n * extra_ns for t, n in events.items()}}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(json.dumps(main(sys.argv[1]), indent=1))
