import os

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the interpreter is the only Triton there is, and the mode is fixed by whoever
    # imports triton first (torch itself does, lazily): choose it before any test can.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_secrets_leak(monkeypatch):
    # Tests must never depend on a real key from the developer's shell.
    for name in list(os.environ):
        if name.endswith("_API_KEY"):
            monkeypatch.delenv(name, raising=False)
