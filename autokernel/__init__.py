"""autokernel: make PyTorch models faster with custom Triton and CUDA C++ kernels.

One package per pipeline stage, imports only downward (cli -> kernelbench -> deploy -> search ->
judging, profile -> harness/, the judge, which never imports autokernel):

    profile/      model file -> profile -> Amdahl plan
    search/       plan -> run folder: propose, judge, keep or revert, log (LLM agent, tuner)
    judging/      kernel file or ModelNew -> verdict (bench, starters suite, KernelBench protocol)
    deploy/       run -> verify over a workload, report, exported packages
    kernelbench/  KernelBench mode: run, score, export
    cli.py, display.py, errors.py

Importing the package does nothing: no device probes, no folders, no network.
"""
__version__ = "0.1.0"
