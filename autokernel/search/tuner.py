"""The offline tuner: explores a starter kernel's declared TUNABLES under its CONSTRAINTS, no network.

A seeded TPE sampler (optuna, ask/tell) suggests a configuration; `propose` returns the starter with
its CONFIG line rewritten to it; the loop judges the file and reports back through `observe`: the
median time for a PASS, a failed trial otherwise. A configuration is never proposed twice (TPE may
suggest one again: the duplicate is told its known result and the sampler is asked again, a bounded
number of times, then an untried valid configuration is drawn directly). When every valid
configuration has been tried the tuner raises Plateau, which ends the search on that target.
"""
from __future__ import annotations

import itertools
import math
import random
from typing import Any

from autokernel.errors import Plateau, UserError
from autokernel.search.kernel_source import apply_config, check_constraints, read_literals
from autokernel.search.proposer import Candidate, SearchContext

# Spaces up to this many configurations are enumerated once, so exhaustion is known exactly and an
# untried configuration can be drawn when the sampler keeps repeating itself.
ENUMERATION_LIMIT = 100_000
BACKWARD_PREFIX = "BWD_"  # a starter's TUNABLES for its backward_fn (playbook/training.md)
MAX_ASKS = 16  # sampler suggestions per proposal before drawing an untried configuration directly

Key = tuple[tuple[str, Any], ...]


class Tuner:
    """A Proposer (name "tune") over one starter's TUNABLES."""

    name = "tune"

    def __init__(self, starter_source: str, *, seed: int = 0, dims: dict[str, int] | None = None,
                 max_asks: int = MAX_ASKS, training: bool = False):
        import optuna  # slow to import: only when the tuner is used
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        literals = read_literals(starter_source)
        self.source = starter_source
        self.tunables: dict[str, list] = {k: list(v) for k, v in (literals.get("TUNABLES") or {}).items()
                                          # the backward's knobs only where a backward is judged:
                                          # elsewhere they change nothing the judge times
                                          if training or not k.startswith(BACKWARD_PREFIX)}
        self.constraints = literals.get("CONSTRAINTS") or []
        self.base_config: dict[str, Any] = dict(literals.get("CONFIG") or {})
        self.dims = dict(dims or {})
        self.max_asks = max_asks
        self._check_declarations()
        self.distributions = {k: optuna.distributions.CategoricalDistribution(v)
                              for k, v in self.tunables.items()}
        self.study = optuna.create_study(direction="minimize",
                                         sampler=self._sampler(optuna, seed))
        self._rng = random.Random(seed)
        self.tried: dict[Key, float | None] = {}  # configuration -> median_us (None: failed)
        self._pending: dict[Key, Any] = {}  # configurations proposed, awaiting their verdict
        self._valid: list[Key] | None = self._enumerate()

    @staticmethod
    def _sampler(optuna: Any, seed: int) -> Any:
        import warnings
        with warnings.catch_warnings():  # constant_liar is marked experimental
            warnings.simplefilter("ignore")
            # constant_liar: with several trials in flight TPE counts the pending ones as bad
            # results, so it spreads out instead of asking again near them; with one in flight
            # (nothing pending at ask time) it samples as before
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)

    # ------------------------------------------------------------------ the space
    def _check_declarations(self) -> None:
        bad = [k for k, v in self.tunables.items() if not v]
        if bad:
            raise UserError(f"the starter's TUNABLES has no values for {', '.join(bad)}",
                            "give each tunable a non-empty list of values")
        try:
            check_constraints(self.constraints, self._names({**self.base_config,
                                                             **{k: v[0] for k, v in self.tunables.items()}}))
        except ValueError as e:
            raise UserError(f"the starter's CONSTRAINTS cannot be evaluated: {e}",
                            "constraints may use TUNABLES names, the target's dims, numbers, "
                            "arithmetic, comparisons, and/or/not, min and max") from None

    def _names(self, config: dict[str, Any]) -> dict[str, Any]:
        return {**self.dims, **config}  # constraints may also name the target's dims

    def _key(self, config: dict[str, Any]) -> Key:
        return tuple((k, config.get(k)) for k in self.tunables)

    def config_of(self, key: Key) -> dict[str, Any]:
        return {**self.base_config, **dict(key)}

    def valid(self, key: Key) -> bool:
        return check_constraints(self.constraints, self._names(self.config_of(key)))

    @property
    def space_size(self) -> int:
        return math.prod(len(v) for v in self.tunables.values()) if self.tunables else 0

    def _enumerate(self) -> list[Key] | None:
        if self.space_size > ENUMERATION_LIMIT:
            return None
        names = list(self.tunables)
        keys = (tuple(zip(names, values)) for values in itertools.product(*self.tunables.values()))
        return [key for key in keys if self.valid(key)] if names else []

    @property
    def exhausted(self) -> bool:
        return self._valid is not None and all(k in self.tried or k in self._pending for k in self._valid)

    # ------------------------------------------------------------------ Proposer
    def propose(self, ctx: SearchContext | None = None) -> Candidate:
        if self.exhausted:
            if not self.tunables:
                raise Plateau("the starter declares no TUNABLES to explore")
            if not self._valid:
                raise Plateau("no configuration of TUNABLES satisfies CONSTRAINTS at this target")
            raise Plateau(f"the tuner has tried all {len(self._valid)} valid configurations of TUNABLES")
        for _ in range(self.max_asks):
            trial = self.study.ask(self.distributions)
            key = self._key(trial.params)
            if key in self.tried or key in self._pending:
                self._tell(trial, self.tried.get(key))  # TPE learns the repeat's known result
                continue
            if not self.valid(key):
                self.tried[key] = None
                self._tell(trial, None)
                continue
            return self._candidate(key, trial)
        return self._draw_untried()

    def _draw_untried(self) -> Candidate:
        untried = [k for k in self._valid or [] if k not in self.tried and k not in self._pending]
        if not untried:
            raise Plateau(f"the tuner found no new valid configuration in {self.max_asks} suggestions")
        key = self._rng.choice(untried)
        self.study.enqueue_trial(dict(key))
        return self._candidate(key, self.study.ask(self.distributions))

    def _candidate(self, key: Key, trial: Any) -> Candidate:
        self._pending[key] = trial
        config = self.config_of(key)
        description = "tune " + ", ".join(f"{k}={v}" for k, v in key)
        # parent 0: every configuration rewrites the starter (experiment 0), whichever was best
        return Candidate(source=apply_config(self.source, config), description=description, config=config, parent=0)

    def observe(self, candidate: Candidate, verdict: dict | None) -> None:
        config = candidate.config
        if config is None and candidate.source:
            config = read_literals(candidate.source).get("CONFIG")
        if config is None:
            return
        timing = (verdict or {}).get("timing") or {}
        passed = (verdict or {}).get("verdict") == "PASS"
        self.record(config, timing.get("median_us") if passed else None)

    def hold(self, config: dict[str, Any]) -> None:
        """A configuration in flight that this tuner did not propose (a resumed run judging again
        what a killed session had submitted): never proposed again; its result comes by `observe`."""
        self._pending.setdefault(self._key(config), None)

    def record(self, config: dict[str, Any], median_us: float | None) -> None:
        """A configuration's result, from this run or, on resume, from the run's history."""
        key = self._key(config)
        self.tried[key] = median_us
        trial = self._pending.pop(key, None)
        if trial is not None:
            self._tell(trial, median_us)
        elif all(v in self.tunables[k] for k, v in key):  # e.g. the starter's own CONFIG
            import optuna
            state = optuna.trial.TrialState.COMPLETE if median_us is not None else optuna.trial.TrialState.FAIL
            self.study.add_trial(optuna.trial.create_trial(
                params=dict(key), distributions=self.distributions, state=state, value=median_us))

    def _tell(self, trial: Any, median_us: float | None) -> None:
        import optuna
        if median_us is None:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, median_us)
