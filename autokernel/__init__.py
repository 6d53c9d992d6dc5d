"""autokernel: make PyTorch models faster with custom Triton and CUDA C++ kernels.

Importing the package does nothing: no device probes, no folders, no network.
"""
__version__ = "0.1.0"
