"""KernelBench mode: search a level's problems for ModelNew solutions (run.py), score a run with
fast_p and geometric-mean speedups and export it in KernelBench's layout (score.py), and the
`autokernel kernelbench` sub-commands (cli.py) with their text (render.py). adapters.py wraps the
Triton starters of level-1 problems whose forward is one of our kernel types.

Judging one ModelNew by KernelBench's protocol is autokernel/judging/kb_evaluate.py: module-target
search judges with it too. Built on search/ and judging/.

Importing the package does nothing; torch is imported only by the functions that need it.
"""
