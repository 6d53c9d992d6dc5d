"""The judge: kernel-type registry, correctness stages, isolation, timing and device probes.

Nothing here imports `autokernel`: the judge does not depend on the contestant.
"""
