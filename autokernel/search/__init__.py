"""Stage 2, search: the run that looks for faster kernels, unattended, for as long as its budget lasts.

Takes the plan and the run's options. Gives a run folder (runs/<id>/): state, leaderboard.tsv,
every candidate with its verdict (and prompt and reply), best/<target>.py, all sealed by hashes.

Open first: run_search.py (the run: each next visit goes to the target worth most per minute,
chosen by schedule.py, with its strategy), then loop.py (one visit of one target: propose from its
population (population.py: elites, parent, inspirations), judge, keep or revert, log). start.py
opens a run; run.py and journal.py are the folder and its state; leaderboard.py, seal.py and guard.py its records; parallel.py and slots.py keep several
candidates in flight; proposer.py is the seam that llm.py + prompt.py (the LLM agent) and tuner.py +
kernel_source.py (the offline tuner) fill; module_problem.py and module_search.py search module
targets as KernelBench problems. Reads profile/ and judging/; judges through harness/.
"""
