"""What a kernel's calls are checked for, in the worker and the judging process alike:
the cases each stage runs (cases.py, open first), the comparison with the float64 reference
(compare.py), what a kernel_fn did with PyTorch and which kernels it launched (integrity.py,
launches.py), and loading and calling a candidate under observation in the worker (candidate.py);
a backward's cases, values and check (backward.py, backward_cases.py, backward_values.py).

Never: takes the candidate's process at its word; the worker observes, the judging process decides.
"""
