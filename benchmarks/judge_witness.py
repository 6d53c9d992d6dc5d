"""The judge against lying kernels, and honest kernels on a loaded machine: figures, not a test.

    python benchmarks/judge_witness.py table [--repeat 1]    # three lying kernels beside the honest
                                                             # one, in one judge session
    python benchmarks/judge_witness.py honest [-n 10] [--load 1] [--default-shape] [--kernel FILE ...]
                                                             # honest verdicts in a row, with N busy
                                                             # loops; integrity failures counted

`table` judges, in one session, the honest softmax of tests/support/judge_kernels.py and three lying kernels
(tests/attacks/attack_kernels.py: a traceback walk that shrinks recorded samples, a clock
swapped for one call that restores itself, a file read and sent by UDP at import), prints each
verdict with its reason and its median against the honest one, and whether anything arrived at the
UDP listener. `honest` judges an honest kernel again and again while busy loops hold the other
cores, and prints each verdict's median beside what the judge's own clock saw. Timings on a CPU are
Triton-interpreter time: they say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "tests" / "support", ROOT / "tests" / "attacks"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from harness.judge import judge  # noqa: E402
from harness.workers.judge_session import judge_session  # noqa: E402
from harness.kernel_types.registry import Case  # noqa: E402

SMALL = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)
TABLE = ("traceback_shrinks_samples", "self_restoring_clock", "udp_exfiltration")


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "").replace("\n", " ")


def _median(v: dict) -> float | None:
    return (v.get("timing") or {}).get("median_us")


def table(repeat: int) -> int:
    import attack_kernels
    import judge_kernels
    folder = Path(tempfile.mkdtemp(prefix="ak-witness-bench-"))
    (folder / "home").mkdir()
    secret = folder / "home" / "secret.txt"
    secret.write_text("a secret from the home folder")
    (folder / "run" / "best").mkdir(parents=True)
    (folder / "run" / "leaderboard.tsv").write_text("experiment\n")
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.setblocking(False)
    bait = attack_kernels.Bait(secret, secret.read_text(), folder / "run", listener.getsockname()[1],
                               folder / "unused.sock")
    sources = {"honest": judge_kernels.source(), **{n: attack_kernels.sources(bait)[n] for n in TABLE}}
    paths = {}
    for name, text in sources.items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    with judge_session(fork=True):
        for round_no in range(1, repeat + 1):
            verdicts = {name: judge(path, target=SMALL, device="cpu") for name, path in paths.items()}
            honest = _median(verdicts["honest"])
            for name, v in verdicts.items():
                ratio = f"{_median(v) / honest:.2f}x honest" if _median(v) and honest else "-"
                print(f"round {round_no} {name:28} {v['verdict']:5} {v['failed_stage'] or '':10} "
                      f"median {_median(v) or 0:10.1f} us ({ratio})  {_reason(v)[:240]}", flush=True)
    try:
        arrived = listener.recvfrom(65536)
    except BlockingIOError:
        arrived = None
    print(f"UDP listener on 127.0.0.1: {'RECEIVED ' + repr(arrived) if arrived else 'nothing arrived'}")
    return 0


def honest(n: int, load: int, default_shape: bool, kernels: list[str] | None = None) -> int:
    paths = [Path(k) for k in kernels] if kernels else [ROOT / "tests" / "data" / "kernels" / "good" / "softmax_rows.py"]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    failures = wide = 0
    try:
        with judge_session(fork=True):
            for i in range(n):
                path = paths[i % len(paths)]
                start = time.perf_counter()
                v = judge(path, target=None if default_shape or path.name != "softmax_rows.py" else SMALL, device="cpu")
                timing = v.get("timing") or {}
                w = timing.get("witness") or {}
                failures += v["failed_stage"] == "integrity"
                wide += timing.get("spread_ok") is False
                spreads = "/".join(f"{100 * r['iqr_us'] / r['median_us']:.0f}%" for r in timing.get("rounds", []))
                print(f"{i + 1:3d} {path.stem[:20]:20} {v['verdict']:5} {v['failed_stage'] or '':10} "
                      f"IQR/median {spreads:>9} spread_ok {timing.get('spread_ok')!s:5} "
                      f"median {_median(v) or 0:12.1f} us  "
                      f"judge's clock {w.get('witnessed_median_us', 0):12.1f} us  overhead {w.get('overhead_us', 0):7.1f} us"
                      f"  allowed >= {max(w.get('lower_us', 0), 0):12.1f} us  {time.perf_counter() - start:5.1f} s"
                      f"  {_reason(v)[:160]}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(f"{n} honest verdicts with {load} busy loop(s): {failures} integrity failure(s), "
          f"{wide} timing(s) whose spread was not trusted")
    return 1 if failures or wide else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("table")
    t.add_argument("--repeat", type=int, default=1)
    h = sub.add_parser("honest")
    h.add_argument("-n", type=int, default=10)
    h.add_argument("--load", type=int, default=1, help="busy loops to run meanwhile (the other core: 1)")
    h.add_argument("--default-shape", action="store_true", help="the judge's own CPU timing shape, not a tiny one")
    h.add_argument("--kernel", action="append", default=None,
                   help="an honest kernel file to judge in turn (repeatable; default: a small good softmax)")
    ns = p.parse_args(argv)
    return table(ns.repeat) if ns.mode == "table" else honest(ns.n, ns.load, ns.default_shape, ns.kernel)


if __name__ == "__main__":
    raise SystemExit(main())
