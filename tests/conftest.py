import os
import shutil
import tempfile

import pytest
import torch

# Measured peaks are cached per machine: a probe the developer's machine took while busy would
# otherwise change every plan these tests make. One fresh cache per test session, shared by the
# subprocesses the tests start (they inherit the environment).
_OWN_CACHE = None if "AUTOKERNEL_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="ak-test-cache-")
if _OWN_CACHE:
    os.environ["AUTOKERNEL_CACHE_DIR"] = _OWN_CACHE


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)

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
