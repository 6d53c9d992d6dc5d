"""Stage 1, profile and plan: where a model's time goes, and what each bottleneck could be worth.

Takes a model file (KernelBench format or any nn.Module, modelfile.py) and its options. Gives the
profile, rolled up to kernel types and module targets, and the Amdahl plan: plan.json's ranked
targets, each with its roofline ceiling and end-to-end projection.

Open first: profiler.py (`profile_model`), then plan.py. records.py turns raw profiler records into
op trees, attribution.py charges each op's time to one target (a backward op to its forward op's),
forms.py recognises hand-written forms, module_targets.py and op_work.py charge the time and work no
kernel type names, training.py makes a training step. Reads only harness/ (the kernel-type registry).
"""
