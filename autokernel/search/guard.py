"""The record guard: what a candidate could change in the run folder while it is judged, taken
before the judge call and compared after it, in a time that does not grow with the run.

The OS sandbox keeps a candidate out of the run folder (harness/isolation/sandbox.py); this guard is for what
gets past it (a machine without Landlock, where the verdict's sandbox kind is "none"). Walking and
reading every file of a long run around each call cost more than the experiments did, so it
guards, each part at a constant cost:
- every file outside kernels/<target>/ (config, plan, state, leaderboard, best/, problems/, ...),
  by its stat and, for small files, its content, read again only when the stat changed; the
  records the search rewrites from memory (`rebuilt`: the leaderboard, state.json and its journal,
  which grow with the run) by their stat alone;
- each kernels/<target>/ folder by its own stat: a file added, removed or renamed there changes
  it, and only then is the folder listed against what it held and what the writer wrote since;
- the files of the candidates in flight (`held`): their text is the search's, so it is put back.
What it cannot see cheaply, an old experiment's file rewritten in place, is caught by the hashes
the search recorded when it wrote the file (autokernel.search.seal.check_run: at the end of a run, on
--resume and by `autokernel leaderboard --check`), which then refuse the run, naming the file.

File times tick coarsely on some kernels: a change within one tick of the snapshot may not show in
the stat, so a file changed shortly before the snapshot is compared by content (its last 8 KiB
for a rebuilt record). A file added to a kernels/<target>/ folder within that tick is the one
change left to the end-of-run check.
"""
from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

# Python imports a file's cached bytecode instead of its text when the cache's recorded mtime and
# size match: a planted cache beside a checked file would run unchecked code.
BYTECODE_DIR = "__pycache__"
EXPERIMENTS = "kernels"  # kernels/<target>/exp_NNNN.*: too many files to walk, watched as folders
FRESH_NS = 200_000_000  # well above the coarse tick of file times
TAIL_BYTES = 8 << 10  # a rebuilt record's last rows: where a change within one tick would be
MAX_RECORD_BYTES = 64 << 20  # no small record is this big: a bigger file is kept by its stat alone


def _key(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode)


def _content(path: str, st: os.stat_result) -> bytes:
    """A file's bytes; for anything else (a link, a pipe that would block a read, a file too big to
    hold) a stand-in that changes whenever it does."""
    if stat.S_ISLNK(st.st_mode):
        return b"link:" + os.fsencode(os.readlink(path))
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
        return f"special:{st.st_mode}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}".encode()
    try:
        return Path(path).read_bytes()
    except OSError as e:
        return f"unreadable:{e}".encode()


def _tail(path: str, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(size - TAIL_BYTES, 0))
            return f.read(TAIL_BYTES)
    except OSError as e:
        return f"unreadable:{e}".encode()


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


class RecordGuard:
    """The run folder's guarded parts as they were before a judge call; `restore()` names what
    the call changed and puts back what it can.

    `written` is the writer's own record of the files it wrote (autokernel.search.run.RunDir.written);
    `rebuilt` names records the caller rewrites from memory when they are touched (they are named,
    not put back here). One guard serves a whole target's search: an unchanged file is not read
    again, and a kernels/<target>/ folder is listed once, when first seen."""

    def __init__(self, run: str | Path, written: dict[str, str] | None = None, rebuilt: tuple[str, ...] = ()):
        self.run = Path(run)
        self.written = {} if written is None else written
        self.rebuilt = frozenset(rebuilt)
        self._cache: dict[str, tuple[tuple, bytes]] = {}
        self._listed: dict[str, set[str]] = {}  # kernels/<target> -> its names when first seen
        self.before: dict[str, Any] = {}
        self.folders: set[str] = set()
        self.watched: dict[str, tuple] = {}  # kernels/<target> -> the folder's stat
        self.held: dict[str, tuple[tuple | None, bytes]] = {}
        self._fresh_ns = 0

    def snapshot(self, held: dict[str, str] | None = None) -> "RecordGuard":
        """Take the guarded parts as they are; `held`: run-relative path -> the text the search
        holds for it (the candidates about to be judged, and their prompts and replies)."""
        # file times tick coarsely (a few ms): a file changed since shortly before the snapshot is
        # compared by content whatever its stat says, so a write within one tick cannot hide
        self._fresh_ns = time.time_ns() - FRESH_NS
        self.before, self.folders, self.watched = self._walk(taking=True)
        self.held = {rel: (self._lstat_key(rel), text.encode("utf-8")) for rel, text in (held or {}).items()}
        return self

    def restore(self) -> list[str]:
        """Put back every changed or removed file it can, remove every added one (and the folders
        added to hold them); the run-relative paths touched, sorted."""
        after, folders, watched = self._walk(taking=False)
        touched = [p for p in set(self.before) | set(after) if self.before.get(p) != after.get(p)]
        for rel in touched:
            if rel in self.rebuilt:
                continue  # the writer rewrites it from the state it holds
            path = self.run / rel
            _remove(path)
            if rel in self.before:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self.before[rel])
        for rel in sorted(folders - self.folders, key=lambda p: p.count("/"), reverse=True):
            folder = self.run / rel
            if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                folder.rmdir()
        touched += self._restore_folders(watched)
        touched += self._restore_held()
        return sorted(set(touched))

    # ------------------------------------------------------------------ walking the small parts
    def _walk(self, taking: bool) -> tuple[dict[str, Any], set[str], dict[str, tuple]]:
        """Every file outside the experiment folders by path relative to the run, every folder
        (the judge writes no bytecode there, so a cache that appears while a candidate runs is the
        candidate's), and each experiment folder's stat."""
        files: dict[str, Any] = {}
        folders: set[str] = set()
        watched: dict[str, tuple] = {}
        pending = [(str(self.run), "")]
        while pending:
            folder, prefix = pending.pop()
            try:
                with os.scandir(folder) as scan:
                    entries = list(scan)
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone while walked: the comparison names what it held
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    folders.add(rel)
                    if prefix == EXPERIMENTS + "/":
                        watched[rel] = _key(entry.stat(follow_symlinks=False))
                        if taking and rel not in self._listed:
                            self._listed[rel] = set(os.listdir(entry.path))
                    else:
                        pending.append((entry.path, rel + "/"))
                elif rel in self.rebuilt:
                    files[rel] = self._token(entry)
                else:
                    files[rel] = self._read(rel, entry)
        if taking:
            for rel in set(self._cache) - set(files):
                del self._cache[rel]
        return files, folders, watched

    def _read(self, rel: str, entry: os.DirEntry) -> bytes:
        st = entry.stat(follow_symlinks=False)
        key = _key(st)
        cached = self._cache.get(rel)
        if cached is None or cached[0] != key or st.st_ctime_ns >= self._fresh_ns:
            cached = (key, _content(entry.path, st))
            self._cache[rel] = cached
        return cached[1]

    def _token(self, entry: os.DirEntry) -> tuple:
        """A rebuilt record by its stat; by its last bytes too when it changed within a tick of the
        snapshot (its times may then not show a second change)."""
        st = entry.stat(follow_symlinks=False)
        token: tuple = ("record", *_key(st))
        if st.st_ctime_ns >= self._fresh_ns and stat.S_ISREG(st.st_mode):
            token += (_tail(entry.path, st.st_size),)
        return token

    def _lstat_key(self, rel: str) -> tuple | None:
        try:
            return _key(os.lstat(self.run / rel))
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ the experiment folders
    def _restore_folders(self, watched: dict[str, tuple]) -> list[str]:
        """Experiment folders whose stat changed: entries nobody wrote removed, missing ones named
        (those of candidates in flight are put back by _restore_held)."""
        touched = []
        for rel in sorted(set(self.watched) | set(watched)):
            before, now = self.watched.get(rel), watched.get(rel)
            if before == now:
                continue
            path = self.run / rel
            if before is None or now is None:  # a folder made, or one removed whole
                touched.append(rel + "/")
                if before is None:
                    _remove(path)
                continue
            expected = self._expected(rel)
            present = set(os.listdir(path))
            for name in present - expected:
                touched.append(f"{rel}/{name}")
                _remove(path / name)
            touched += [f"{rel}/{name}" for name in expected - present]
        return touched

    def _expected(self, folder: str) -> set[str]:
        """What an experiment folder should hold: its names when first seen, and what the writer
        and the candidates in flight put there since."""
        prefix = folder + "/"
        names = set(self._listed.get(folder, ()))
        for rel in list(self.written) + list(self.held):
            if rel.startswith(prefix) and "/" not in rel[len(prefix):]:
                names.add(rel[len(prefix):])
        return names

    def _restore_held(self) -> list[str]:
        """The files of the candidates in flight, put back from the text the search holds."""
        touched = []
        for rel, (key, data) in self.held.items():
            path = self.run / rel
            now = self._lstat_key(rel)
            if now is not None and now == key and now[2] < self._fresh_ns:
                continue
            if now is not None and stat.S_ISREG(now[5]) and path.read_bytes() == data:
                continue
            touched.append(rel)
            _remove(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return touched
