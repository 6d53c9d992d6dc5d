"""KernelBench's protocol: seeds, a problem's inputs and models, timing with refilled
inputs (kb_protocol.py, open first), and the child that evaluates a ModelNew, one mode per isolated
process (kb_worker.py).

Never: imports a solution in the process that computes the reference.
"""
