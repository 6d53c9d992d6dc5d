"""The judge, seen from the command line and the search: a file in, a verdict out.

The judge itself (the stages, the sandbox, the witnessed timing) is harness/. Here are its fronts:
bench.py (`autokernel bench FILE`) and suite.py (every starter at its bench shapes), and
KernelBench's protocol for a ModelNew solution, shared by `kernelbench eval` and module-target
search: kb_evaluate.py (open it first for ModelNew), with kb_checks.py (what the parent decides
from the children's records) and kb_problems.py (loading problems). Reads only harness/.
"""
