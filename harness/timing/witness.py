"""The outside witness of every timed rep: what the worker says it measured, checked against the
judge's own clock.

A candidate shares the worker's process, so whatever the worker measures it could rewrite: a clock
swapped for one call, samples shrunk through a traceback. So the worker reports each timed rep to
the judging process as it happens, one datagram per line, over a unix socket it connects before
the candidate is imported (and before the sandbox closes sockets):

    S <phase> <i>          just before rep i's timed region starts
    E <phase> <i> <us>     just after it ends, with the time it measured (before the next rep)
    X <json text>          the audit hook refused something the candidate's code tried
    R <sha256>             a line the worker wrote to its events file, as it wrote it
    H <name> <sha256>      an output the worker saved, as it saved it

The judging process asked its kernel to stamp every datagram with the system clock at the moment
it was sent (SO_TIMESTAMPNS), and reads them on a thread (`Witness`), so no sample can be rewritten
after it is sent and the judge's own scheduling on a busy machine does not move a stamp (where the
kernel gives no stamp, the thread stamps each line with time.monotonic() as it arrives). The
interval between a rep's S and E stamps contains the timed call plus a small fixed overhead (a
send, and on a GPU the event records and the synchronize); the worker calibrates that overhead in
the same session, before the candidate is imported, by timing a null call the same way (phase
`null`). `agreement` then holds each rep's reported time to its own interval on the judge's clock,
within a bound it states, and asks that more than half the reps keep it.

On the CPU the worker's clock starts before S is sent. Sending S wakes the judge's reader, and on a
busy machine the worker may then wait a scheduler slice or two before it runs again; with the clock
started after the send, that wait would be in the judge's interval but not in the worker's time,
and an honest rep would look like a lie. On a GPU the worker's time is the events' and the order is
unchanged: the start event is recorded after S is sent, so the send is not added to every kernel's
time.

The socket lives in a folder of the judge's that the sandbox neither lets the worker read nor write,
and the sandbox refuses socket(2) itself: the worker's connected descriptor is the only way in.
Code in the worker could still send lines of its own through that descriptor; they break the strict
S/E sequence (`Reps`), and a descriptor swapped for another socket is caught by its inode before
every send (`Reporter`).

With every line the reader also notes how long, so far, some task on the machine has waited for a
CPU (Linux's pressure stall information, /proc/pressure/cpu): over a round of reps, that gives the
share of the round the machine was oversubscribed (`Reps.cpu_wait`), the judge's own measure of
a busy machine when a spread is too wide to trust.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import socket
import statistics
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# The bound, stated in every verdict: a rep's reported time may be at most this much faster than the
# judge's clock says (witnessed interval minus the calibrated overhead); SLACK covers the judge's
# wake-up jitter on a busy machine. Only this side is bounded: a worker gains nothing by reporting
# more time than it took, while a judge woken late for a rep's start would see a short interval.
LOWER_RATIO = 0.8
SLACK_FLOOR_US = 50.0
SLACK_IQRS = 3.0
MAX_LINES = 20_000  # a worker that floods the socket is not timing anything; its lines stop counting
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's number, where Python does not name it

PRESSURE = Path("/proc/pressure/cpu")
Reading = tuple[float, float]  # (time.monotonic() in s, cpu_stall_us()) as the reader kept a line

# Bound before any candidate is imported: the reporter's own system calls are not the candidate's.
_write, _fstat = os.write, os.fstat


def cpu_stall_us() -> float | None:
    """Microseconds since boot during which some runnable task waited for a CPU (the "some" line's
    total in /proc/pressure/cpu), or None where the kernel keeps no such figure."""
    try:
        text = PRESSURE.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for item in line.split():
                if item.startswith("total="):
                    return float(item[len("total="):])
    return None


class WitnessBroken(RuntimeError):
    """The worker's end of the witness socket is no longer the socket the judge is reading."""


class Reporter:
    """The worker's end: one datagram per line, written straight to the descriptor (a send that
    raises no audit event, so the audit hook can report through it too)."""

    def __init__(self, path: str | Path):
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.connect(str(path))
        self._fd = self._socket.fileno()
        self._inode = _fstat(self._fd).st_ino

    def start(self, phase: str, i: int) -> None:
        self._send(f"S {phase} {i}\n")

    def end(self, phase: str, i: int, us: float) -> None:
        self._send(f"E {phase} {i} {us!r}\n")

    def refused(self, text: str) -> None:
        self._send("X " + json.dumps(text[:2000]) + "\n")

    def record(self, digest: str) -> None:
        self._send(f"R {digest}\n")

    def output(self, name: str, digest: str) -> None:
        self._send(f"H {name} {digest}\n")

    def _send(self, line: str) -> None:
        # a descriptor swapped for another socket would let the candidate replay the judge's lines late
        if _fstat(self._fd).st_ino != self._inode:
            raise WitnessBroken("the witness socket was replaced while the candidate's code ran")
        _write(self._fd, line.encode())


class Witness:
    """The judge's end: a unix datagram socket in a private folder, read on a thread that keeps each
    line with the kernel's stamp of when it was sent."""

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="ak-witness-")
        self.path = Path(self._dir, "reps")
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(self.path))
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass  # no kernel stamps here: the reader's own clock stands in
        self._socket.setblocking(False)
        self._stop_r, self._stop_w = os.pipe()
        self.lines: list[tuple[float, str]] = []
        self.readings: list[Reading | None] = []  # with each line: (time.monotonic(), cpu_stall_us())
        self._pressure = cpu_stall_us() is not None
        self.flooded = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="ak-witness", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._socket, self._stop_r], [], [])
            if self._socket in ready:
                with self._lock:
                    self._drain(keep=True)
                continue
            return  # stopped, and nothing left to read

    def _drain(self, keep: bool) -> None:
        while True:
            try:
                data, ancillary, _, _ = self._socket.recvmsg(65536, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            if keep:
                self._keep(data, _stamp(ancillary))

    def _keep(self, data: bytes, stamp: float) -> None:
        if len(self.lines) >= MAX_LINES:
            self.flooded = True
            return
        self.lines.append((stamp, data.decode("utf-8", "replace").rstrip("\n")))
        stall = cpu_stall_us() if self._pressure else None
        self.readings.append((time.monotonic(), stall) if stall is not None else None)

    def reset(self) -> None:
        """Forget everything reported so far (a worker that is started again reports from scratch)."""
        with self._lock:
            self._drain(keep=False)
            self.lines.clear()
            self.readings.clear()
            self.flooded = False

    def close(self) -> "Record":
        """Stop reading (after the worker has exited) and parse what arrived."""
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=10)
        with self._lock:
            self._drain(keep=True)
        self._socket.close()
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)
        shutil.rmtree(self._dir, ignore_errors=True)
        return parse(self.lines, self.flooded, self.readings)


def _stamp(ancillary) -> float:
    """When the kernel says the datagram was sent (seconds), or now by the reader's clock."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return seconds + nanoseconds * 1e-9
    return time.monotonic()


@dataclass
class Reps:
    """One phase's reps as the judge saw them: what the worker reported, the judge's intervals, and
    the machine's CPU pressure read as each rep's S and E arrived."""
    samples_us: list[float] = field(default_factory=list)
    intervals_us: list[float] = field(default_factory=list)
    open_start: tuple[int, float, Reading | None] | None = None  # (i, stamp, reading) of an S waiting for its E
    pressure: list[tuple[Reading | None, Reading | None]] = field(default_factory=list)

    def cpu_wait(self, first: int, stop: int) -> float | None:
        """The share of the time from rep `first`'s start to rep `stop - 1`'s end during which some
        task on the machine waited for a CPU, or None where it was not read."""
        if not 0 <= first < stop <= len(self.pressure):
            return None
        start, end = self.pressure[first][0], self.pressure[stop - 1][1]
        if start is None or end is None or end[0] <= start[0]:
            return None
        return min(1.0, max(0.0, (end[1] - start[1]) / ((end[0] - start[0]) * 1e6)))


@dataclass
class Record:
    phases: dict[str, Reps] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    problem: str | None = None  # the first line that broke the protocol
    digests: list[str] = field(default_factory=list)  # R: each events-file line's sha256, in order
    outputs: dict[str, str] = field(default_factory=dict)  # H: each saved output's sha256 by name

    def reps(self, phase: str) -> Reps | None:
        return self.phases.get(phase)


def parse(lines: list[tuple[float, str]], flooded: bool = False,
          readings: list[Reading | None] | None = None) -> Record:
    record = Record()
    if flooded:
        record.problem = f"more than {MAX_LINES} lines arrived on the witness socket"
    for n, (stamp, line) in enumerate(lines):
        parts = line.split(" ", 1)
        if parts[0] == "X" and len(parts) == 2:
            record.refusals.append(_json_text(parts[1]))
            continue
        if parts[0] in ("R", "H"):
            problem = _digest(record, line)
            if problem and record.problem is None:
                record.problem = problem
            continue
        problem = _step(record, stamp, line, readings[n] if readings and n < len(readings) else None)
        if problem and record.problem is None:
            record.problem = problem  # never the line itself: a forged line may carry anything
    for phase, reps in record.phases.items():
        if reps.open_start is not None and record.problem is None:
            record.problem = f"rep {reps.open_start[0]} of {phase} started and never ended"
    return record


# the phases only the clean baseline worker (harness/workers/baseline.py) times: never a candidate's
BASELINE_PHASES = ("eager", "compiled")


def baseline_line(record: Record) -> str | None:
    """Why a candidate's channel is refused for carrying a baseline line, or None: its process never
    times a baseline, so any such line is written by the candidate."""
    for phase in record.phases:
        if phase.split(":")[0] in BASELINE_PHASES:
            return (f"the candidate's process sent a baseline line (phase {phase!r}) on its witness socket: "
                    "baselines are timed in a clean worker that never imports a candidate, and nothing a "
                    "candidate's process says about a baseline is believed")
    return None


def _digest(record: Record, line: str) -> str | None:
    """Keep an R or H line; why it is malformed or repeats an output's name, or None."""
    parts = line.split()
    if parts[0] == "R" and len(parts) == 2:
        record.digests.append(parts[1])
        return None
    if parts[0] == "H" and len(parts) == 3:
        if parts[1] in record.outputs:
            return f"the output {parts[1]!r} was reported saved twice"
        record.outputs[parts[1]] = parts[2]
        return None
    return "a malformed line"


def _json_text(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return text[:2000]
    return value if isinstance(value, str) else str(value)[:2000]


def _step(record: Record, stamp: float, line: str, reading: Reading | None = None) -> str | None:
    """Apply one S or E line; why it breaks the strict S i, E i, S i+1 ... order, or None."""
    parts = line.split()
    if len(parts) < 3 or parts[0] not in ("S", "E"):
        return "a line the timing loop does not send"
    kind, phase = parts[0], parts[1]
    reps = record.phases.setdefault(phase, Reps())
    try:
        i = int(parts[2])
        us = float(parts[3]) if kind == "E" else None
    except (ValueError, IndexError):
        return "a malformed line"
    expected = len(reps.samples_us)
    if kind == "S":
        if reps.open_start is not None or i != expected:
            return f"rep {i} of {phase} started out of order"
        reps.open_start = (i, stamp, reading)
        return None
    if reps.open_start is None or reps.open_start[0] != i or len(parts) != 4:
        return f"rep {i} of {phase} ended without its start"
    if not us >= 0.0:  # negative or NaN: no clock gives that
        return f"rep {i} of {phase} reported {us} us"
    reps.samples_us.append(us)
    reps.intervals_us.append((stamp - reps.open_start[1]) * 1e6)
    reps.pressure.append((reps.open_start[2], reading))
    reps.open_start = None
    return None


def _iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


def agreement(timed: Reps, null: Reps | None) -> dict:
    """Does the worker's time agree with the judge's clock? Rep by rep: rep i agrees when its sample
    is at least LOWER_RATIO x (its own interval - the calibrated overhead) - slack, and the timing
    agrees when more than half the reps do. Pairing each sample with its own interval keeps a rep
    the judge's clock saw late (a busy machine preempting the worker between its clock and its send)
    from moving the bound for the others. A worker that under-reports more than half its reps is
    caught; one that under-reports fewer cannot move its median below its fastest rep that agrees,
    that is, below the bound of a rep the judge saw. The figures and the bound, for the verdict."""
    overhead = statistics.median(null.intervals_us) if null and null.intervals_us else 0.0
    slack = max(SLACK_FLOOR_US, SLACK_IQRS * _iqr(null.intervals_us if null else []))
    lowers = [LOWER_RATIO * (interval - overhead) - slack for interval in timed.intervals_us]
    within = sum(sample >= lower for sample, lower in zip(timed.samples_us, lowers))
    reps = len(timed.samples_us)
    witnessed = statistics.median(timed.intervals_us)
    return {"reported_median_us": statistics.median(timed.samples_us), "witnessed_median_us": witnessed,
            "overhead_us": overhead, "witnessed_minus_overhead_us": witnessed - overhead, "slack_us": slack,
            "lower_us": statistics.median(lowers), "reps": reps, "reps_within_bound": within,
            "null_reps": len(null.samples_us) if null else 0,
            "bound": (f"in more than half the reps, the worker's time >= {LOWER_RATIO:g} x (that rep's interval on "
                      f"the judge's clock - calibrated null-call overhead) - slack; slack = max({SLACK_FLOOR_US:g} "
                      f"us, {SLACK_IQRS:g} x the null call's IQR)"),
            "agrees": 2 * within > reps}


def disagreement_text(a: dict) -> str:
    return (f"the time measured inside the worker disagrees with the judge's own clock in "
            f"{a['reps'] - a['reps_within_bound']} of {a['reps']} reps: the worker's median is "
            f"{a['reported_median_us']:.6g} us, the judge's clock saw {a['witnessed_median_us']:.6g} us per rep "
            f"minus {a['overhead_us']:.4g} us of calibrated overhead = {a['witnessed_minus_overhead_us']:.6g} us; "
            f"the bound allows no less than {max(a['lower_us'], 0.0):.6g} us at the median ({a['bound']})")
