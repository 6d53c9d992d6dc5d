"""The judge's processes: a run's shared judge session (judge_session.py, open first), the
pre-imported zygote and the parent's side of it (zygote.py, forkserver.py), and the worker child that
runs one candidate through the stages and records what it saw (worker.py).

Never: decides a verdict; the worker only records, in a process assumed hostile.
"""
