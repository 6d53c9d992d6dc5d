"""The small vocabulary of errors autokernel raises on purpose.

`UserError` is anything the user can fix (a bad file, a missing key, an unreachable endpoint): the
CLI prints its message and hint and exits 1 (2 for usage errors) without a traceback. The loop
stops through `StopSearch` subclasses rather than flags threaded through it.
"""
from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; `hint` says how."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message + (f"\n  hint: {self.hint}" if self.hint else "")


class UsageError(UserError):
    """The command line or an input file does not fit the contract: exit status 2."""

    exit_code = 2


class StopSearch(Exception):
    """Ends the search on a target or on the whole run."""


class BudgetExhausted(StopSearch):
    pass


class Plateau(StopSearch):
    pass


class Interrupted(StopSearch):
    pass


class TargetDone(StopSearch):
    """This target's search is over for a reason other than a plateau; the run goes on."""


class Switch(StopSearch):
    """Another target is now the better use of the next minutes: this one waits, it is not over."""


class NothingUsable(StopSearch):
    """The LLM gave nothing that could be judged for too long: the run stops and says why."""
