"""Triton starter kernels, one module per kernel type (see the package docstring for TUNABLES)."""
