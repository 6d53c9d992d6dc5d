"""What a confined process may read: a C compiler installed outside the system folders is readable
(torch.compile and Triton build host code with it inside the sandbox), and nothing above it."""
from __future__ import annotations

import os

from harness.isolation import sandbox


def _fake_compiler(root, name="gcc"):
    bin_dir = root / "opt" / "gcc" / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    return root / "opt" / "gcc"


def test_a_compiler_outside_the_system_folders_is_readable_to_a_confined_process(tmp_path, monkeypatch):
    prefix = _fake_compiler(tmp_path)
    monkeypatch.setenv("PATH", f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}")
    roots = sandbox.read_roots()
    assert str(prefix) in roots
    assert str(tmp_path) not in roots and str(tmp_path / "opt") not in roots


def test_cc_names_the_compiler_where_path_does_not(tmp_path, monkeypatch):
    prefix = _fake_compiler(tmp_path, "mycc")
    monkeypatch.setenv("CC", str(prefix / "bin" / "mycc"))
    assert str(prefix) in sandbox.read_roots()
