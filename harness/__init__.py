"""The judge: `judge(kernel_file) -> verdict` (judge.py, open first), a pure function of (kernel
source, target, device) that runs the candidate in an isolated, confined process and decides
everything itself from what that process recorded.

One package per concern, top to bottom (imports only point down; tests/test_architecture.py):
    workers/       the processes: the session's pre-imported zygote, the worker that runs a candidate
    kernelbench/   KernelBench's protocol and its child
    verdict/       the judging process's reading of the worker's records, stage by stage and timing
    timing/        the timing loop, the baselines, watched timed calls on fresh values, the witness
    correctness/   the cases, the comparison, what a call did with PyTorch and which kernels it launched
    isolation/     the subprocess, the static check, the audit hook, the OS sandbox, the identity check
    device/        measured peaks, the roofline, versions
    compiling/     compiling for a target GPU without one: registers, spills, shared memory
    kernel_types/  the registry: contracts, references, inputs, tolerances, FLOP and byte counts
cuda_launcher.py and cuda_build.py stay at the top: CUDA C++ kernel files and exported packages
import them by that path.

Never: imports `autokernel`; the judge does not depend on the contestant.
"""
