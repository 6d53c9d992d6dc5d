"""Stage 3, deploy: the winners back in the unmodified model, proven there, and shipped.

Takes a finished run folder. Gives verify.json (the winners bound into the model and run over a
workload against float64), report.md and progress.png, and exported packages (our own, with
`patch(model)`, or a Hugging Face kernel repository whose layers `kernels.kernelize` binds).

Open first: verify.py. routing/ binds winners into a model at patch time (the router, its sites,
serving ranges); winners.py loads a run's winners; workload.py, verify_workload.py and accuracy.py
run and judge the patched model; verify_train.py, fine_tune.py, train_workload.py and
train_figures.py fine-tune it with and without the winners (verify --train); verify_child.py runs
it inside the sandbox; export.py, kernel_package.py (the package's own code), kernel_layers.py and
hf_kernels.py write the exports, export_check.py selftests them; report.py writes the report. Reads
search/'s run folder.
"""
