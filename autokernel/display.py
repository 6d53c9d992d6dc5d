"""What a run shows while it works and when it ends.

On a terminal: a live panel (target, experiment, best speedup, budget left, the last experiments).
Otherwise (a log file, CI, a pipe): one plain line per event, greppable. Both go to stderr; the
final summary table is the command's output and goes to stdout.
"""
from __future__ import annotations

import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from autokernel.search.proposer import Experiment
from autokernel.search.run import RunState, TargetState

RECENT_LINES = 6
STOP_KINDS = {"user": "stopped by the user", "budget": "budget spent", "done": "every target done",
              "nothing_usable": "nothing usable from the LLM", "failed": "failed"}


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f} us" if value >= 100 else f"{value:.3g} us"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def experiment_line(target: TargetState, e: Experiment) -> str:
    """One greppable line per experiment."""
    stage = f" at {e.failed_stage}" if e.failed_stage else ""
    timing = f" {_us(e.median_us)}" if e.median_us is not None else ""
    versus = f" ({_x(target.speedup_vs_starter)} vs starter)" if e.decision == "KEEP" else ""
    return f"[{target.name} #{e.number}] {e.decision} {e.verdict}{stage}{timing}{versus} - {e.description}"


class LogDisplay:
    """Plain lines on stderr."""

    def __init__(self, state: RunState, console: Console | None = None):
        self.state = state
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)

    def start_target(self, target: TargetState, index: int, count: int) -> None:
        visit = f"revisit {target.parks}" if target.parks else "visit"
        self.line(f"[target {index + 1}/{count}] {target.name}: {visit}, strategy {target.strategy or '-'}; "
                  f"chosen: {target.chosen_because or '-'}; {_hours(self.state.budget_left_s)} of budget left")

    def status(self, text: str) -> None:
        pass  # progress within an experiment is for the live panel only

    def experiment(self, target: TargetState, e: Experiment) -> None:
        self.line(experiment_line(target, e))

    def end_target(self, target: TargetState) -> None:
        self.line(f"[target {target.status}] {target.name}: {target.stop_reason or target.status}; best "
                  f"{_us(target.best_median_us)} ({_x(target.speedup_vs_starter)} vs starter)")

    def close(self) -> None:
        pass


class LiveDisplay(LogDisplay):
    """A live rich panel on a terminal; experiment lines scroll above it."""

    def __init__(self, state: RunState, console: Console | None = None):
        super().__init__(state, console or Console(stderr=True))
        self._target: TargetState | None = None
        self._position = ""
        self._status = "starting"
        self._started = time.monotonic()
        self._live = Live(self._render(), console=self.console, refresh_per_second=2, transient=True)
        self._live.start()

    def _render(self) -> Panel:
        t = self._target
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("target", f"{t.name} {self._position}" if t else "-")
        grid.add_row("strategy", f"{t.strategy or '-'} (plateaus so far: {t.parks})" if t else "-")
        grid.add_row("chosen", t.chosen_because if t else "-")
        grid.add_row("experiment", f"{t.next_experiment}" if t else "-")
        grid.add_row("best", f"{_us(t.best_median_us)}  {_x(t.speedup_vs_starter)} vs starter, "
                             f"{_x(t.speedup_vs_eager)} vs eager" if t else "-")
        grid.add_row("budget left", _hours(self.state.budget_left_s))
        grid.add_row("now", self._status)
        return Panel(Group(grid), title=f"autokernel run {self.state.run_id} ({self.state.agent})",
                     title_align="left")

    def _refresh(self) -> None:
        self._live.update(self._render())

    def line(self, text: str) -> None:
        self.console.print(Text(text))

    def start_target(self, target: TargetState, index: int, count: int) -> None:
        self._target, self._position = target, f"({index + 1}/{count})"
        super().start_target(target, index, count)
        self._refresh()

    def status(self, text: str) -> None:
        self._status = text
        self._refresh()

    def experiment(self, target: TargetState, e: Experiment) -> None:
        super().experiment(target, e)
        self._refresh()

    def close(self) -> None:
        self._live.stop()


def make_display(state: RunState, live: bool | None = None) -> LogDisplay:
    """The live panel on a terminal, plain lines otherwise."""
    if live is None:
        live = sys.stderr.isatty()
    return LiveDisplay(state) if live else LogDisplay(state)


def summary_table(state: RunState, cpu_figures: bool = False) -> Table:
    """The end of a run: per target, what was tried and what was won."""
    ended = STOP_KINDS.get(state.stop_kind, "")
    table = Table(title=f"Run {state.run_id}: {state.status}{f' ({ended})' if ended else ''}: {state.stop_reason}",
                  title_justify="left", header_style="bold")
    for name, justify in (("target", "left"), ("share", "right"), ("experiments", "right"),
                          ("starter", "right"), ("best", "right"), ("vs starter", "right"),
                          ("vs eager", "right"), ("strategy", "left"), ("status", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for t in state.targets:
        table.add_row(t.name, f"{t.share:.1%}", str(t.proposals), _us(t.baseline_median_us),
                      _us(t.best_median_us), _x(t.speedup_vs_starter), _x(t.speedup_vs_eager),
                      f"{t.strategy or '-'}" + (f" ({t.parks} plateaus)" if t.parks else ""),
                      t.stop_reason or t.status)
    table.caption = (f"search time {_hours(state.elapsed_s)} of {_hours(state.budget_s)}; best kernels in "
                     f"best/, every experiment in leaderboard.tsv")
    for model, used in state.tokens.items():
        table.caption += (f"\n{model}: {used.get('replies', 0)} replies, {used.get('prompt_tokens', 0):,} prompt + "
                          f"{used.get('completion_tokens', 0):,} completion tokens")
    if cpu_figures:
        table.caption += ("\nCPU figures: Triton-interpreter time against PyTorch on the CPU; "
                          "they say nothing about GPU speed")
    table.caption_justify = "left"
    return table
