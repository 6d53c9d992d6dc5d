"""KernelBench problems: from a local checkout, a single file, or (optionally) the Hugging Face hub.

A problem is one Python file named like `19_ReLU.py` (id 19, name ReLU) defining `Model`,
`get_inputs()` and `get_init_inputs()`; KernelBench keeps them under `KernelBench/level1/` ...
`level4/` of its repository. A solution is a file defining `ModelNew`.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from autokernel.errors import UsageError, UserError
from harness.isolation import syntax

FILE_RE = re.compile(r"^(\d+)_(.+)\.py$")
LEVEL_RE = re.compile(r"^level(\d+)$")
HUB_DATASET = "ScalingIntelligence/KernelBench"


@dataclass(frozen=True)
class Problem:
    path: Path
    problem_id: int | None
    name: str
    level: int | None = None

    @property
    def key(self) -> str:
        """The problem's name in runs and leaderboards: its file stem, e.g. 19_ReLU."""
        return self.path.stem

    def source(self) -> str:
        return self.path.read_text(encoding="utf-8")

    def to_json(self) -> dict:
        return {"path": str(self.path), "problem_id": self.problem_id, "name": self.name,
                "level": self.level, "key": self.key}


def problem_from_file(path: str | Path, level: int | None = None) -> Problem:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no such problem file: {path}", "pass a KernelBench problem such as level1/19_ReLU.py")
    m = FILE_RE.match(path.name)
    if level is None:
        lm = LEVEL_RE.match(path.parent.name)
        level = int(lm.group(1)) if lm else None
    if m:
        return Problem(path, int(m.group(1)), m.group(2), level)
    return Problem(path, None, path.stem, level)


def parse_ids(spec: str | None) -> set[int] | None:
    """'1-10,17' -> {1, ..., 10, 17}; None or '' -> None (every problem)."""
    if not spec:
        return None
    ids: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UsageError(f"bad problem list {spec!r} at {part!r}", "write ids and ranges, e.g. 1-10,17")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise UsageError(f"bad range {part!r}: the end is before the start")
        ids.update(range(lo, hi + 1))
    return ids


def level_dir(kb_dir: str | Path, level: int) -> Path:
    """The folder of one level, given KernelBench's repository root or the folder holding level1/."""
    root = Path(kb_dir)
    for candidate in (root / "KernelBench" / f"level{level}", root / f"level{level}"):
        if candidate.is_dir():
            return candidate
    if not root.is_dir():
        raise UsageError(f"no such directory: {root}", "point --kb-dir at a KernelBench checkout")
    raise UsageError(f"no level{level}/ under {root} or {root / 'KernelBench'}",
                     "point --kb-dir at KernelBench's repository root or at the folder holding level1/")


def find_problems(kb_dir: str | Path, level: int, ids: str | set[int] | None = None) -> list[Problem]:
    """The problems of one level, by id, optionally only those listed."""
    wanted = parse_ids(ids) if isinstance(ids, str) or ids is None else ids
    folder = level_dir(kb_dir, level)
    found = []
    for path in folder.glob("*.py"):
        m = FILE_RE.match(path.name)
        if m and (wanted is None or int(m.group(1)) in wanted):
            found.append(Problem(path, int(m.group(1)), m.group(2), level))
    found.sort(key=lambda p: p.problem_id)
    if wanted:
        missing = sorted(wanted - {p.problem_id for p in found})
        if missing and not found:
            raise UsageError(f"no problem with id {', '.join(map(str, missing))} in {folder}")
    if not found:
        raise UsageError(f"no problem files (like 19_ReLU.py) in {folder}")
    return found


def load_problems(source: str | Path, level: int | None = None, ids: str | None = None) -> list[Problem]:
    """A single problem file, or a KernelBench checkout with --level (and --problems)."""
    path = Path(source)
    if path.is_file():
        return [problem_from_file(path, level)]
    if level is None:
        raise UsageError(f"{path} is a directory: say which level", "add --level 1 (and --problems 1-10)")
    return find_problems(path, level, ids)


def _top_level_names(path: Path) -> set[str] | None:
    try:
        tree = syntax.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError:
        return None
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_problem_file(path: str | Path) -> None:
    """A usage error unless the file defines Model, get_inputs and get_init_inputs."""
    path = Path(path)
    names = _top_level_names(path)
    if names is None:
        raise UsageError(f"the problem file {path} has a syntax error")
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
    if missing:
        raise UsageError(f"{path} is not a KernelBench problem: it lacks {', '.join(missing)}",
                         "a problem defines class Model, get_inputs() and get_init_inputs()")


def check_solution_file(path: str | Path) -> None:
    """A usage error unless the file exists and defines ModelNew (a syntax error is the solution's
    failure, judged as such, not a usage error)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"no such solution file: {path}", "pass a file that defines class ModelNew")
    names = _top_level_names(path)
    if names is not None and "ModelNew" not in names:
        raise UsageError(f"{path} defines no ModelNew", "a solution defines class ModelNew(nn.Module)")


def hub_problems(level: int, dest: str | Path, ids: str | None = None) -> list[Problem]:
    """KernelBench's problems from the Hugging Face hub (needs the optional `datasets` package and
    network access), written as files under dest/level{L}/ so they load like a checkout."""
    try:
        import datasets  # optional: only this function needs it
    except ImportError as e:
        raise UserError("loading KernelBench from the Hugging Face hub needs the `datasets` package",
                        "pip install datasets, or clone KernelBench and pass --kb-dir") from e
    rows = datasets.load_dataset(HUB_DATASET, split=f"level_{level}")
    folder = Path(dest) / f"level{level}"
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        name = row.get("name") or f"{row['problem_id']}_problem"
        stem = name if FILE_RE.match(f"{name}.py") else f"{row['problem_id']}_{name}"
        (folder / f"{stem}.py").write_text(row["code"], encoding="utf-8")
    return find_problems(dest, level, ids)
