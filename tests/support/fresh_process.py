"""Code for a fresh interpreter that must run an export as a user without autokernel would."""

# Prepended to a `python -c` script: from here on, importing autokernel, harness or starter_kernels
# fails, so whatever runs must come from the exported folder itself (or site-packages).
NO_PROJECT_CODE = r'''
import importlib.abc, sys


class NoProjectCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autokernel", "harness", "starter_kernels"):
            raise ImportError(f"{name} is not available to an export: it must carry all it needs")
        return None


sys.meta_path.insert(0, NoProjectCode())
'''
