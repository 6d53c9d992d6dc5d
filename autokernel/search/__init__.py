"""Stage 2, search: the run that looks for faster kernels, target by target, unattended.

Takes the plan and the run's options. Gives a run folder (runs/<id>/): state, leaderboard.tsv,
every candidate with its verdict (and prompt and reply), best/<target>.py, all sealed by hashes.

Open first: run_search.py (every target of the plan in turn), then loop.py (one target: propose,
judge, keep or revert, log). start.py opens a run; run.py and journal.py are the folder and its
state; leaderboard.py, seal.py and guard.py its records; parallel.py and slots.py keep several
candidates in flight; proposer.py is the seam that llm.py + prompt.py (the LLM agent) and tuner.py +
kernel_source.py (the offline tuner) fill; module_problem.py and module_search.py search module
targets as KernelBench problems. Reads profile/ and judging/; judges through harness/.
"""
