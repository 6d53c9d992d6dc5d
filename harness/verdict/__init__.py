"""The judging process's verdict, from the worker's records: every stage decided from
outputs it rechecks against references it rebuilds (verdict_checks.py, open first), every timed call
held to the same rules and references, the spread and the witness (timing_checks.py), and the
shapes around a target, checked and timed like the target (around.py); a backward's stages and
timed calls (backward_checks.py, backward_timed_checks.py, backward_timing_checks.py).

Never: imports the candidate, or takes a figure from its process that it cannot check.
"""
