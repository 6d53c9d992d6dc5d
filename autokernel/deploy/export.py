"""`autokernel export RUN --out DIR`: the run's winners as a package that needs only torch and triton.

    DIR/autokernel_kernels/
      __init__.py          autokernel/deploy/kernel_package.py, verbatim: patch(model), KERNELS, selftest()
      routing/             autokernel/deploy/routing/, verbatim: the binding `verify` used, so they cannot drift
      kernels/<target>.py  each winner's file, as judged
      vendor/harness/      with CUDA C++ winners only: harness/cuda_launcher.py and cuda_build.py,
                           verbatim, which build a CUDA winner's launch library with nvcc where the
                           package runs and call it through ctypes
      manifest.json        target, kernel type, backend, dims, dtype, source file, route, modules,
                           serving range, whether its backward serves (judged), figures
      tests/test_kernels.py  pytest: selftest() (each kernel against PyTorch at its target shape)

`--format hf-kernels` writes the same package as a Hugging Face kernel repository instead
(autokernel/deploy/hf_kernels.py, which builds on this module). Left out, with the reason in the
manifest: kernels verify.json names guilty, and any kernel file that imports autokernel, harness
or starter_kernels beyond the CUDA launcher the package carries.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from autokernel.errors import UsageError, UserError
from autokernel.search.run import RunDir
from autokernel.deploy.verify import FILENAME as VERIFY_FILE
from autokernel.deploy.winners import WinnerFile, members_instead, winner_files
from harness.isolation import syntax

PACKAGE = "autokernel_kernels"
FORMATS = ("package", "hf-kernels")
OWN_PACKAGES = ("autokernel", "harness", "starter_kernels")
# what a CUDA C++ kernel file imports of the judge: the package carries these files (vendor/harness/)
VENDORED = {"harness.cuda_launcher": ("cuda_launcher.py", "cuda_build.py")}
# ... and what every winner is held to again when the package loads it: the static check
SURFACE = ("__init__.py", "static_check.py", "kernel_surface.py", "tensor_flow.py", "cuda_surface.py", "purity.py",
           "syntax.py")
# The audit hook that watches the winners in the user's process (kernel_package.py's _guard)
GUARD = ("audit_hook.py", "audit_policy.py")
# ... and the judge's one launch monitor and op recorder, around every served call (served.py)
MONITOR = ("launches.py", "integrity.py", "served.py", "interpreter_numerics.py", "interpreter_speed.py",
           "program_order.py", "shared_accesses.py", "compiler_hints.py", "unspecified.py", "autotuning.py")
GUARD_INIT = ('"""The judge\'s audit hook, launch monitor and op recorder, copied verbatim: what a served winner '
              'may not do (see ../__init__.py)."""\n')
VENDOR_INIT = '"""The files of autokernel\'s judge a winner needs (its static check; a CUDA C++ winner\'s launcher), copied verbatim."""\n'
TEST_FILE = '''"""Each exported kernel against PyTorch at its target shape (no GPU: TRITON_INTERPRET=1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the folder that holds the package

import autokernel_kernels  # noqa: E402


def test_kernels_match_pytorch():
    errors = autokernel_kernels.selftest()
    # a CUDA C++ kernel cannot run without a GPU and nvcc: UNAVAILABLE says why
    assert set(errors) == {k["target"] for k in autokernel_kernels.KERNELS} - set(autokernel_kernels.UNAVAILABLE)
'''


@dataclass
class Exported:
    """The winners that go into a package: their files and manifest, and what was left out."""

    run: RunDir
    manifest: dict
    sources: dict[str, Path]  # module name under kernels/ -> the winner's file in the run

    @property
    def cuda(self) -> bool:
        return any(k["backend"] == "cuda" for k in self.manifest["kernels"])


def export(run_path: str | Path, out_dir: str | Path) -> dict:
    """Write DIR/autokernel_kernels; the manifest written, plus "package": its folder."""
    exported = collect(run_path)
    package = Path(out_dir) / PACKAGE
    prepare(package, package / "manifest.json")
    write_package(exported, package)
    (package / "tests").mkdir()
    (package / "tests" / "test_kernels.py").write_text(TEST_FILE, encoding="utf-8")
    return {**exported.manifest, "package": str(package)}


def check_format(format: str) -> None:
    """--format: this module's package, or autokernel.deploy.hf_kernels' repository."""
    if format not in FORMATS:
        raise UsageError(f"unknown --format {format!r}", f"use one of: {', '.join(FORMATS)}")


def collect(run_path: str | Path) -> Exported:
    """The run's exportable winners, after checking its records."""
    from autokernel.search.seal import require_sealed
    run = RunDir(run_path)
    require_sealed(run.path, "export refused")  # never package a winner that is not the text that was judged
    verified = _read_verify(run)
    kernels, left_out, sources = [], [], {}
    files = winner_files(run)
    bound = {f.target for f in files if f.decision and f.decision.get("served") == "chain"}
    for d in verified.get("chains") or []:  # verify found a chain's form fits no call: its members serve
        if d.get("chain") in bound and d.get("served") != "chain":
            members_instead(files, d["chain"], d.get("why", "verify bound its members"))
    for f in files:
        reason = leave_out_reason(f, verified)
        if reason:
            left_out.append({"target": f.target, "reason": reason})
            continue
        module = module_name(f.target)
        sources[module] = f.path
        kernels.append(_entry(f, module, verified))
    manifest = {"run_id": run.run_id, "exported": datetime.now().isoformat(timespec="seconds"),
                "verified": bool(verified), "outputs_match": verified.get("outputs_match"),
                "e2e_speedup": verified.get("e2e_speedup"), "device": verified.get("device"),
                "cpu_figures": verified.get("cpu_figures"), "kernels": kernels, "left_out": left_out,
                "chains": [f.decision for f in files if f.decision]}  # chain or its members: which is bound, and why
    return Exported(run, manifest, sources)


def write_package(exported: Exported, package: Path, manifest_extra: dict | None = None) -> None:
    """The package's files in an empty folder `package`: __init__, routing/, kernels/, vendor/ for
    CUDA C++ winners, manifest.json (with `manifest_extra` added)."""
    here = Path(__file__).resolve().parent
    shutil.copytree(here / "routing", package / "routing", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copyfile(here / "kernel_package.py", package / "__init__.py")
    judge = Path(importlib.util.find_spec("harness").origin).parent
    (package / "guard").mkdir()
    (package / "guard" / "__init__.py").write_text(GUARD_INIT, encoding="utf-8")
    for name in GUARD:
        shutil.copyfile(judge / "isolation" / name, package / "guard" / name)
    for name in MONITOR:
        shutil.copyfile(judge / "correctness" / name, package / "guard" / name)
    (package / "kernels").mkdir()
    (package / "kernels" / "__init__.py").write_text('"""The exported kernel files, as judged."""\n', encoding="utf-8")
    for module, path in exported.sources.items():
        shutil.copyfile(path, package / "kernels" / f"{module}.py")
    vendor = package / "vendor" / "harness"
    (vendor / "isolation").mkdir(parents=True)
    (vendor / "__init__.py").write_text(VENDOR_INIT, encoding="utf-8")
    for name in SURFACE:
        shutil.copyfile(judge / "isolation" / name, vendor / "isolation" / name)
    if exported.cuda:
        for name in sorted({n for files in VENDORED.values() for n in files}):
            shutil.copyfile(judge / name, vendor / name)
    from harness.isolation.static_check import allowed_imports, submodule_prefixes
    allowed = allowed_imports("cuda", model=True)  # what the guard lets a winner import when served
    manifest = {**exported.manifest, "kernel_imports": list(allowed),
                "kernel_import_prefixes": list(submodule_prefixes(allowed)), **(manifest_extra or {})}
    (package / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _read_verify(run: RunDir) -> dict:
    path = run.path / VERIFY_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON: {e}", f"rerun `autokernel verify {run.path}`") from None


def prepare(folder: Path, marker: Path) -> None:
    """An empty folder; a previous export (it has `marker`) is replaced, anything else is never touched."""
    if folder.exists():
        if not marker.is_file():
            raise UserError(f"{folder} exists and is not an earlier export",
                            "choose another --out folder, or remove it yourself")
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


def module_name(target: str) -> str:
    """A Python module name for a target: rmsnorm[128x384:float32] -> rmsnorm_128x384_float32."""
    name = re.sub(r"\W+", "_", target).strip("_")
    return name if name[:1].isalpha() else f"k_{name}"


def backend_of(tree: ast.Module) -> str:
    return next((n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                 and any(isinstance(t, ast.Name) and t.id == "BACKEND" for t in n.targets)), "triton")


def leave_out_reason(f: WinnerFile, verified: dict) -> str:
    """Why a winner cannot go into the package ('' when it can)."""
    if f.target in verified.get("guilty", []):
        why = verified.get("per_kernel", {}).get(f.target, {}).get("guilty_reason") or "its outputs differ"
        return f"guilty in verify.json: {why}"
    if f.unrun_dtype:  # a PASS that rests on a dtype the judge did not run serves nothing
        return f.unrun_dtype
    if f.not_served:  # a chain or its members: only the side with the larger measured gain is bound
        return f.not_served
    source = f.path.read_text(encoding="utf-8")
    try:
        tree = syntax.parse(source)
    except SyntaxError as e:
        return f"{f.path.name} does not parse: {e}"
    carried = set(VENDORED) if backend_of(tree) == "cuda" else set()
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        own = [n for n in names if n.split(".")[0] in OWN_PACKAGES and n not in carried]
        if own:
            return f"it imports {own[0]}, which the package does not carry"
    return ""


def _entry(f: WinnerFile, module: str, verified: dict) -> dict:
    checked = verified.get("per_kernel", {}).get(f.target, {})
    trained_wrong = ((verified.get("train") or {}).get("guilty") or {}).get(f.target)
    if trained_wrong:  # its forward still serves inference; its backward does not ship as served
        f.backward, f.inference_only = False, f"inference only: verify --train found that {trained_wrong}"
    backend = backend_of(syntax.parse(f.path.read_text(encoding="utf-8")))
    return {"target": f.target, "kernel_type": f.kernel_type, "backend": backend, "dims": f.dims, "dtype": f.dtype,
            "kwargs": f.kwargs, "source": f"kernels/{module}.py", "route": f.route, "modules": f.modules,
            "serving": f.serving, "backward": f.backward, "inference_only": f.inference_only,
            "training_serving": f.training_serving if f.backward else None,
            "judged_layouts": f.judged_layouts and f.backward,
            "experiment": f.experiment, "speedup_vs_eager": f.speedup_vs_eager,
            "calls_served_in_verify": checked.get("calls_served"),
            "verified": bool(checked) and not checked.get("guilty", False) and not checked.get("not_run"),
            "not_run_in_verify": checked.get("not_run")}
