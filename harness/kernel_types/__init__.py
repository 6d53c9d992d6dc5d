"""The kernel-type registry: the judge's ground truth.

Takes a type name, gives a `KernelType`: its kernel_fn signature, the float64 reference, PyTorch's
eager op (the timing baseline), seeded inputs, the shapes each stage uses, tolerances, FLOP and byte
counts. registry.py (open first) is the table, kernel_type.py its data types; types/ holds the nine
types by family, and references.py says where and in what precision the true answer is computed.

Never: imports another package of the judge, or anything a candidate wrote.
"""
