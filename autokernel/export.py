"""`autokernel export RUN --out DIR`: the run's winners as a package that needs only torch and triton.

    DIR/autokernel_kernels/
      __init__.py          autokernel/kernel_package.py, verbatim: patch(model), KERNELS, selftest()
      routing/             autokernel/routing/, verbatim: the binding `verify` used, so they cannot drift
      kernels/<target>.py  each winner's file, as judged
      manifest.json        target, kernel type, dims, dtype, source file, route, modules, serving range, figures
      tests/test_kernels.py  pytest: selftest() (each kernel against PyTorch at its target shape)

Left out, with the reason in the manifest: kernels verify.json names guilty, CUDA C++ kernels (they
build with nvcc at run time through harness.cuda_launcher, which the package does not carry) and any kernel file that
imports autokernel, harness or starter_kernels.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
from datetime import datetime
from pathlib import Path

from autokernel.errors import UserError
from autokernel.run import RunDir
from autokernel.verify import FILENAME as VERIFY_FILE
from autokernel.winners import WinnerFile, winner_files

PACKAGE = "autokernel_kernels"
OWN_PACKAGES = ("autokernel", "harness", "starter_kernels")
TEST_FILE = '''"""Each exported kernel against PyTorch at its target shape (no GPU: TRITON_INTERPRET=1)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the folder that holds the package

import autokernel_kernels  # noqa: E402


def test_kernels_match_pytorch():
    errors = autokernel_kernels.selftest()
    assert set(errors) == {k["target"] for k in autokernel_kernels.KERNELS}
'''


def export(run_path: str | Path, out_dir: str | Path) -> dict:
    """Write DIR/autokernel_kernels; the manifest written, plus "package": its folder."""
    from autokernel.seal import require_sealed
    run = RunDir(run_path)
    require_sealed(run.path, "export refused")  # never package a winner that is not the text that was judged
    verified = _read_verify(run)
    package = Path(out_dir) / PACKAGE
    _prepare(package)
    here = Path(__file__).resolve().parent
    shutil.copytree(here / "routing", package / "routing", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copyfile(here / "kernel_package.py", package / "__init__.py")
    (package / "kernels").mkdir()
    (package / "kernels" / "__init__.py").write_text('"""The exported kernel files, as judged."""\n', encoding="utf-8")
    kernels, left_out = [], []
    for f in winner_files(run):
        reason = leave_out_reason(f, verified)
        if reason:
            left_out.append({"target": f.target, "reason": reason})
            continue
        module = module_name(f.target)
        shutil.copyfile(f.path, package / "kernels" / f"{module}.py")
        kernels.append(_entry(f, module, verified))
    manifest = {"run_id": run.run_id, "exported": datetime.now().isoformat(timespec="seconds"),
                "verified": bool(verified), "outputs_match": verified.get("outputs_match"),
                "e2e_speedup": verified.get("e2e_speedup"), "device": verified.get("device"),
                "cpu_figures": verified.get("cpu_figures"), "kernels": kernels, "left_out": left_out}
    (package / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (package / "tests").mkdir()
    (package / "tests" / "test_kernels.py").write_text(TEST_FILE, encoding="utf-8")
    return {**manifest, "package": str(package)}


def _read_verify(run: RunDir) -> dict:
    path = run.path / VERIFY_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON: {e}", f"rerun `autokernel verify {run.path}`") from None


def _prepare(package: Path) -> None:
    """An empty package folder; a previous export is replaced, anything else is never touched."""
    if package.exists():
        if not (package / "manifest.json").is_file():
            raise UserError(f"{package} exists and is not an earlier export",
                            "choose another --out folder, or remove it yourself")
        shutil.rmtree(package)
    package.mkdir(parents=True)


def module_name(target: str) -> str:
    """A Python module name for a target: rmsnorm[128x384:float32] -> rmsnorm_128x384_float32."""
    name = re.sub(r"\W+", "_", target).strip("_")
    return name if name[:1].isalpha() else f"k_{name}"


def leave_out_reason(f: WinnerFile, verified: dict) -> str:
    """Why a winner cannot go into the package ('' when it can)."""
    if f.target in verified.get("guilty", []):
        why = verified.get("per_kernel", {}).get(f.target, {}).get("guilty_reason") or "its outputs differ"
        return f"guilty in verify.json: {why}"
    source = f.path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return f"{f.path.name} does not parse: {e}"
    backend = next((n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                    and any(isinstance(t, ast.Name) and t.id == "BACKEND" for t in n.targets)), "triton")
    if backend != "triton":
        return (f"a {backend} kernel: it builds with nvcc at run time through harness.cuda_launcher, which the "
                "package does not carry")
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        own = [n for n in names if n.split(".")[0] in OWN_PACKAGES]
        if own:
            return f"it imports {own[0]}, which the package does not carry"
    return ""


def _entry(f: WinnerFile, module: str, verified: dict) -> dict:
    checked = verified.get("per_kernel", {}).get(f.target, {})
    return {"target": f.target, "kernel_type": f.kernel_type, "dims": f.dims, "dtype": f.dtype, "kwargs": f.kwargs,
            "source": f"kernels/{module}.py", "route": f.route, "modules": f.modules, "serving": f.serving,
            "experiment": f.experiment,
            "speedup_vs_eager": f.speedup_vs_eager, "calls_served_in_verify": checked.get("calls_served"),
            "verified": bool(checked) and not checked.get("guilty", False)}
