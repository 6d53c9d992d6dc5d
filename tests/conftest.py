import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

# Measured peaks are cached per machine: a probe the developer's machine took while busy would
# otherwise change every plan these tests make. One fresh cache per test session, shared by the
# subprocesses the tests start and by pytest-xdist's workers (all inherit the environment of the
# process that made it; a worker finds the variable set and makes none of its own).
_OWN_CACHE = None if "AUTOKERNEL_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="ak-test-cache-")
if _OWN_CACHE:
    os.environ["AUTOKERNEL_CACHE_DIR"] = _OWN_CACHE


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)

# pytest-xdist runs one test process per core: each one, and every process it starts, computing on
# one thread, not on as many OpenMP threads as there are cores spinning against each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Inductor's first CPU compile in a process first proves each vector ISA the CPU reports by
# compiling and loading a test program per ISA: about 9 s in a fresh cache, 1 s in every later
# process. The session's caches start empty, and the tests judge what the compiled baseline is
# used for, not Inductor's check of the compiler: take the CPU's word for its ISAs.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

if not torch.cuda.is_available():
    # Without a GPU the interpreter is the only Triton there is, and the mode is fixed by whoever
    # imports triton first (torch itself does, lazily): choose it before any test can.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser, pluginmanager):
    parser.addoption("--batches-only", action="store_true", default=False,
                     help="only the tests that read a batch of verdicts judged in reverse order under --reverse "
                          "(REVERSED_BATCHES): CI's second pass")
    # pyproject's addopts run the suite on every core with pytest-xdist (-n auto --dist loadfile).
    # Where xdist is not installed (a GPU machine with only torch, triton and pytest), those two
    # options are accepted here and the suite runs in one process. (_addoption: lowercase short
    # options are reserved to plugins, which is what this stands in for.)
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist", "distributed testing: pytest-xdist is not installed, one process runs all")
    group._addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="ignored without pytest-xdist")
    group._addoption("--dist", dest="dist", default="no", help="ignored without pytest-xdist")


# Files that share work made once per process or per cache, by the file that makes it: under
# pytest-xdist they run on one worker, one after the other, so the work is done once.
SHARED_WORK_FILES = {
    "tests/harness/workers/test_forkserver.py": "tests/harness/test_judge.py",  # the session fixture `judged`
    # Inductor's first compile into the session's kept baseline cache probes the CPU's vector ISAs
    # and precompiles its C++ headers (about 10 s); the second compiles in a third of the time
    "tests/harness/timing/test_baseline_cache.py": "tests/judging/test_suite.py",
    # the torch.compile of the backward's joint graph, the training baselines, likewise
    "tests/harness/test_backward_watches.py": "tests/harness/test_backward_judge.py",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (pyproject's addopts: each file's tests on one worker, so a module fixture,
    a batch of verdicts, is made once), with the files of SHARED_WORK_FILES as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_WORK_FILES.get(path, path)

    return SharedFixtureScheduling(config, log)


# The fixtures that judge a batch of verdicts in one session and, under --reverse, in the opposite
# order: what a verdict could owe to the judgements before it (a forked worker, a shared baseline or
# reference, a cache) is there. A test that makes its own judgement in its own process has nothing
# before it to depend on; CI's second pass (--reverse --batches-only) runs only the batches again.
REVERSED_BATCHES = {"judged", "kernelbench_verdicts"}


def pytest_collection_modifyitems(config, items):
    if config.getoption("batches_only"):
        kept = [item for item in items if REVERSED_BATCHES & set(getattr(item, "fixturenames", ()))]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass
class Judged:
    verdicts: dict[str, dict]  # by variant name, or good/<file stem>
    forked: int  # workers the session's zygotes forked
    fallbacks: int  # judgements that could not fork and spawned instead
    baseline_runs: int = 0  # clean baseline workers the session started (forked like the others)


@pytest.fixture(scope="session")
def judged(request, tmp_path_factory) -> Judged:
    """Every kernel of tests/support/judge_kernels.py and tests/data/kernels/good, judged once per session the
    way `autokernel optimize` judges: in a judge session, by workers forked from pre-imported
    zygotes, two at a time (the machine has two cores). tests/harness/test_judge.py checks each verdict;
    tests/harness/workers/test_forkserver.py judges some again by spawned workers and compares.

    Under --reverse (CI's second pass) the batch is judged in the opposite order too, so each
    verdict follows other judgements than it did the first time."""
    import judge_kernels
    from harness.judge import judge
    from harness.workers.judge_session import judge_session
    folder = tmp_path_factory.mktemp("variants")
    paths = judge_kernels.write_variants(folder)
    paths.update({f"good/{p.stem}": p for p in judge_kernels.GOOD.glob("*.py")})
    order = list(paths.items())[::-1 if request.config.getoption("reverse", False) else 1]
    os.environ["AK_TEST_FAKE_API_KEY"] = "sk-must-not-leak"
    os.environ["HF_TOKEN"] = "hf-must-not-leak"
    try:
        with judge_session(fork=True) as session, ThreadPoolExecutor(2) as pool:
            verdicts = dict(zip([name for name, _ in order], pool.map(
                lambda item: judge(item[1], device="cpu", timeout_s=judge_kernels.timeout_s(item[0], forked=True)),
                order)))
            return Judged(verdicts, session.pool.forked, session.pool.fallbacks, session.baselines.runs)
    finally:
        del os.environ["AK_TEST_FAKE_API_KEY"], os.environ["HF_TOKEN"]


@pytest.fixture(autouse=True)
def _no_secrets_leak(monkeypatch):
    # Tests must never depend on a real key from the developer's shell.
    for name in list(os.environ):
        if name.endswith("_API_KEY"):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _no_served_observer_left_by_another_test():
    """Loading winners in-process (winners.py, an exported package) installs the judge's observer of
    served calls for the rest of the process; a later test's plain-PyTorch stand-in winners would be
    refused by it. Each test starts without one and leaves none behind."""
    from autokernel.deploy.routing import refusals
    saved = list(refusals.OBSERVER)
    refusals.OBSERVER.clear()
    yield
    refusals.OBSERVER[:] = saved
