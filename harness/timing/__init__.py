"""Timing and its outside witness: the loop that times a call (timer.py, open first), the
baselines and the candidate's timing in the worker (measurement.py; torch.compile's kept cache in
compile_cache.py), every timed call watched and recorded like a checked one (timed_calls.py), on
values no call has seen (fresh_inputs.py), a second round when the reps spread too widely
(spread.py), and the witness that holds every timed rep to the judge's own clock (witness.py); a
training step's timing and its checked timed calls (backward_timing.py, backward_timed.py).

Never: takes a time from the candidate's process without the witness; never times a baseline
after candidate code has run in that process.
"""
