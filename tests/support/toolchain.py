"""The tools outside Python that some tests need, and the one way every test skips without them."""
import pytest

from harness.cuda_build import nvcc_path

# nvcc builds CUDA C++ for a target (registers, spills, the launch library) with no GPU present;
# without it those tests skip, as a user's CUDA C++ kernels would fail to build
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed (the CUDA toolkit builds CUDA C++)")
