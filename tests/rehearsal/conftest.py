"""A first real launch, rehearsed on the CPU (docs/gpus.md): every place where a kernel first launches
on a GPU, set up by its own code (the OS sandbox, the audit hook, the launch monitor) and run through
Triton's real NVIDIA backend against a stand-in driver (tests/support/standin_gpu.py): the lazy
driver, `platform_key` (which runs `file`), `ldconfig -p`, the gcc build of Triton's launcher support,
the JIT compile with ptxas, the cache writes, the dlopen, the generated argument binder and the launch
monitor, up to the stand-in's launch; CUDA C++ through nvcc, the launch library's build and load, up
to the call that needs a device. The interpreter has none of these, so no other CPU test can tell
whether an honest kernel is refused on a GPU."""
from __future__ import annotations

from pathlib import Path

import pytest

import standin_gpu


def pytest_collection_modifyitems(config, items):
    why = standin_gpu.missing()  # gcc or Landlock missing: said, not silently passed
    if why:
        for item in items:
            if "rehearsal" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def driver(tmp_path_factory) -> Path:
    """The stand-in CUDA driver, built with gcc once per test process."""
    return standin_gpu.build(tmp_path_factory.mktemp("standin-driver"))
