"""The repository tracks source, not build products: no wheels, archives, compiled objects or other
binary files. Recorded data in tests/data is text (JSON, TSV). The check itself is shown to find a
wheel, a compiled object and a file of bytes planted in a scratch repository."""
import shutil
import subprocess
from pathlib import Path

import pytest

from paths import ROOT

# Build products and packed data: each belongs in a registry, a cache or a release, never in git.
BINARY_SUFFIXES = (
    ".whl", ".egg", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".zst", ".zip", ".7z",  # packages, archives
    ".so", ".o", ".a", ".dylib", ".dll", ".pyd", ".exe", ".pyc", ".pyo",  # compiled objects
    ".cubin", ".ptx", ".fatbin",  # compiled GPU code: the judge builds it from source, cached
    ".bin", ".pt", ".pth", ".safetensors", ".npy", ".npz", ".pkl",  # weights and tensors
)
SNIFF_BYTES = 8000  # git's own test for a binary file: a NUL byte in its first 8000 bytes


def tracked_binaries(root: Path) -> list[str]:
    """The tracked files of the checkout at `root` that are binary, by name or by content."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True)
    found = []
    for name in listed.stdout.decode().split("\0"):
        if not name:
            continue
        path = root / name
        if name.lower().endswith(BINARY_SUFFIXES):
            found.append(name)
        elif path.is_file() and b"\0" in path.read_bytes()[:SNIFF_BYTES]:
            found.append(name)
    return found


def _git_checkout(root: Path) -> bool:
    if shutil.which("git") is None:
        return False
    inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True)
    return inside.returncode == 0 and inside.stdout.strip() == b"true"


def test_no_binary_file_is_tracked():
    if not _git_checkout(ROOT):
        pytest.skip("not a git checkout (an sdist or a copy): nothing is tracked")
    assert tracked_binaries(ROOT) == []


def test_the_check_finds_a_planted_wheel_object_and_bytes(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tool-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04")
    (tmp_path / "kernel.o").write_bytes(b"\x7fELF")
    (tmp_path / "weights.dat").write_bytes(b"\x00\x01\x02")
    (tmp_path / "notes.md").write_text("text\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    assert sorted(tracked_binaries(tmp_path)) == ["kernel.o", "tool-1.0-py3-none-any.whl", "weights.dat"]
