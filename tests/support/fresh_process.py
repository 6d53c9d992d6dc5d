"""Code for a fresh interpreter that must run an export as a user without autokernel would."""

# Prepended to a `python -c` script: from here on, importing autokernel or starter_kernels fails, and
# harness only comes from a package's vendor/ folder, so whatever runs must come from the exported
# folder itself (or site-packages).
NO_PROJECT_CODE = r'''
import importlib.abc, importlib.machinery, sys


class NoProjectCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autokernel", "starter_kernels"):
            raise ImportError(f"{name} is not available to an export: it must carry all it needs")
        if name.split(".")[0] == "harness":  # only the judge's files the package carries (vendor/)
            found = importlib.machinery.PathFinder.find_spec(
                name, [p for p in sys.path if p.endswith("vendor")] if path is None else path)
            if found is None or "vendor" not in str(found.origin):
                raise ImportError(f"{name} is not available to an export: it must carry all it needs")
            return found
        return None


sys.meta_path.insert(0, NoProjectCode())
'''
