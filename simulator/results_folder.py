"""A folder ddlsim writes results into: its own files only, one writer at a time.

Rules kept here:

* **Own files only.** ``.ddlsim/manifest.json`` lists (relative paths) every file ddlsim
  wrote or is about to write in the folder. A file that exists and is not listed is the
  user's: ddlsim neither overwrites it (unless ``force``) nor deletes it (ever).
* **Inside, never through a link.** A relative path is taken only if it stays inside the
  folder (no ``..``, not absolute) and no component of it below the folder is a symbolic
  link; a link is refused even with ``force``. The folder itself may be reached through a
  link the user named.
* **One writer.** The folder is locked (``flock`` on the folder itself, so taking the lock
  writes nothing) for as long as a command writes; a second command is refused in one line.
  The lock goes with the process, even on SIGKILL. Opening the same folder twice in one
  process returns the instance already open.
* **Runs recorded.** The manifest also records each run folder's point hash and the backend
  whose results it holds, so a command can see what it would delete or replace before it
  writes anything.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any
from collections.abc import Iterable

from .files import TEMP_MARK, FileRefused, atomic_write, check_target, read_bounded

MANIFEST = ".ddlsim/manifest.json"
TEMPORARY = re.compile(r"\.(.+)\." + re.escape(TEMP_MARK) + r"(?:[a-z0-9_]{8}|link)\.tmp")  # atomic_write's, a link's
MANIFEST_MAX_BYTES = 256 << 20
FORMAT = 1

_OPEN: dict[Path, ResultsFolder] = {}


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` if ``rel`` is a relative path that stays inside ``root`` and no existing
    component of it below ``root`` is a symbolic link; else :class:`FileRefused`."""
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("..", ".", "") for p in parts):
        raise FileRefused(f"{root}: {rel!r} is not a path inside the results folder")
    path = root
    for part in parts:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break
        if stat.S_ISLNK(mode):
            raise FileRefused(f"{path}: is a symbolic link; ddlsim writes and deletes only inside its results "
                              "folder, never through a link")
    return root / rel


class ResultsFolder:
    """The results folder ``root``, locked, with the manifest of ddlsim's own files in it."""

    def __init__(self, root: Path, force: bool = False) -> None:
        self.root = root
        self.force = force
        self.files: set[str] = set()
        self.runs: dict[str, dict[str, Any]] = {}
        self.info: dict[str, Any] = {}
        self._fd: int | None = None
        self._depth = 0

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | os.PathLike[str], force: bool = False) -> ResultsFolder:
        """The folder ``root`` (created if missing), locked for this process, manifest read."""
        given = Path(root)
        outer = _enclosing(given)  # a folder inside one this process holds: no link on the way
        if outer is not None and outer[1] != ".":
            inside(*outer)
        if given.is_symlink() and not given.exists():
            raise FileRefused(f"{given}: is a symbolic link to nothing; name an existing folder or a new path")
        if given.exists() and not given.is_dir():
            raise FileRefused(f"{given}: exists and is not a directory")
        given.mkdir(parents=True, exist_ok=True)
        real = given.resolve()
        folder = _OPEN.get(real)
        if folder is None:
            folder = cls(real, force)
            folder._lock()
            folder._read()
            _OPEN[real] = folder
        folder.force = folder.force or force
        folder._depth += 1
        return folder

    def __enter__(self) -> ResultsFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release this use; the lock goes with the last one."""
        self._depth -= 1
        if self._depth > 0:
            return
        _OPEN.pop(self.root, None)
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def _lock(self) -> None:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise FileRefused(f"{self.root}: another ddlsim command is writing into this folder; wait for it "
                                  "to finish, or choose another --out") from None
            raise
        self._fd = fd

    def _read(self) -> None:
        path = inside(self.root, MANIFEST)
        try:
            data = json.loads(read_bounded(path, MANIFEST_MAX_BYTES, "manifest"))
        except FileNotFoundError:
            return
        except (ValueError, RecursionError, UnicodeDecodeError):
            raise FileRefused(f"{path}: not a ddlsim manifest (unreadable); move the folder aside or choose "
                              "another --out") from None
        ok = (isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("files"), list)
              and all(isinstance(f, str) for f in data["files"]) and isinstance(data.get("runs"), dict)
              and all(isinstance(v, dict) for v in data["runs"].values()) and isinstance(data.get("info", {}), dict))
        if not ok:
            raise FileRefused(f"{path}: not a ddlsim manifest (unexpected content); move the folder aside or "
                              "choose another --out")
        self.files = set(data["files"])
        self.runs = dict(data["runs"])
        self.info = dict(data.get("info", {}))

    def save(self) -> None:
        """Write the manifest (atomically)."""
        blob = {"format": FORMAT, "info": self.info, "runs": self.runs, "files": sorted(self.files)}
        atomic_write(inside(self.root, MANIFEST), json.dumps(blob, separators=(",", ":"), sort_keys=True))

    # -- what ddlsim may touch -------------------------------------------------------------
    def owns(self, rel: str) -> bool:
        """Whether ``rel`` is one of ddlsim's files here (or a path no file holds yet)."""
        return rel in self.files or not os.path.lexists(inside(self.root, rel))

    def foreign(self, rels: Iterable[str]) -> list[str]:
        """The paths among ``rels`` that hold a file ddlsim did not write (links included)."""
        return [r for r in rels if not self.owns(r)]

    def claim(self, rels: Iterable[str], what: str = "--out") -> None:
        """Record ``rels`` as ddlsim's, refusing first (nothing recorded) if one is the user's
        (unless ``force``) or a link (always)."""
        rels = list(rels)
        for r in rels:
            check_target(inside(self.root, r))  # a link, a directory, a device: never, even with force
            if r.split("/", 1)[0] == MANIFEST.split("/", 1)[0]:
                raise FileRefused(f"{self.root / r}: is ddlsim's record of this folder's files; name another file")
        theirs = self.foreign(rels)
        if theirs and not self.force:
            shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
            raise FileRefused(f"{what} {self.root}: holds {shown}, which ddlsim did not write; choose another "
                              f"{what}, or --force to overwrite")
        self.files.update(rels)
        self.save()

    def path(self, rel: str) -> Path:
        """The path of one of ddlsim's files here (claimed first)."""
        if rel not in self.files:
            self.claim([rel])
        return inside(self.root, rel)

    def write(self, rel: str, data: Any) -> Path:
        """Claim ``rel`` and write ``data`` to it atomically."""
        return atomic_write(self.path(rel), data)

    def remove(self, rels: Iterable[str]) -> int:
        """Delete those of ``rels`` that are ddlsim's files here (never a link, never the
        user's), and the run folders they leave empty; how many files went."""
        gone = 0
        parents: set[Path] = set()
        for r in rels:
            if r not in self.files:
                continue
            p = inside(self.root, r)
            if p.is_file() and not p.is_symlink():
                p.unlink()
                gone += 1
            self.files.discard(r)
            parents.add(p.parent)
        for d in sorted(parents, key=lambda q: len(q.parts), reverse=True):
            while d != self.root and d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
                d.rmdir()
                d = d.parent
        self.save()
        return gone

    def under(self, prefix: str) -> list[str]:
        """ddlsim's files here whose path starts with ``prefix``."""
        return sorted(f for f in self.files if f.startswith(prefix))

    def remove_temporaries(self) -> int:
        """Delete the temporaries an interrupted write of one of ddlsim's files left beside it
        (``.NAME.ddlsim-XXXXXXXX.tmp`` as :func:`~ddlsim.simulator.files.atomic_write` names them,
        or ``.NAME.ddlsim-link.tmp``), in its folder only; how many."""
        count = 0
        by_dir: dict[str, set[str]] = {}
        for f in self.files:
            parent, _, name = f.rpartition("/")
            by_dir.setdefault(parent, set()).add(name)
        for parent, names in by_dir.items():
            try:
                d = inside(self.root, parent) if parent else self.root  # never scanned through a link
                entries = list(os.scandir(d))
            except (OSError, FileRefused):
                continue
            for e in entries:
                m = TEMPORARY.fullmatch(e.name)
                if m and m.group(1) in names and e.is_file(follow_symlinks=False):
                    os.unlink(e.path)
                    count += 1
        return count


def place(directory: str | os.PathLike[str], force: bool = False) -> tuple[ResultsFolder, str]:
    """The folder that files written into ``directory`` belong to, opened (close it after),
    and ``directory``'s path in it as a prefix (``""`` or ``"figures/"``): the innermost
    results folder this process already holds that contains ``directory``, else
    ``directory`` itself."""
    d = Path(directory)
    outer = _enclosing(d)
    if outer is None:
        return ResultsFolder.open(d, force), ""
    root, rel = outer
    if rel == ".":
        return ResultsFolder.open(root, force), ""
    inside(root, rel)  # a link below the folder (figures/ → elsewhere) is refused, not followed
    return ResultsFolder.open(root, force), rel + "/"


def _enclosing(path: Path) -> tuple[Path, str] | None:
    """The innermost results folder this process holds that contains ``path`` (compared by
    the real path of each ancestor, so a link above the folder is allowed), and ``path``
    relative to it, spelled as given below it (so a link below it is seen by :func:`inside`)."""
    lexical = Path(os.path.abspath(path))
    for anc in (lexical, *lexical.parents):
        try:
            real = anc.resolve()
        except OSError:
            continue
        if real in _OPEN:
            return real, lexical.relative_to(anc).as_posix()
    return None


def write_file(path: str | os.PathLike[str], data: Any, force: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically as one of ddlsim's files in its folder
    (:func:`place`): refused if the file there is the user's (unless ``force``) or a link."""
    p = Path(path)
    folder, prefix = place(p.parent, force)
    with folder:
        return folder.write(prefix + p.name, data)


__all__ = ["ResultsFolder", "inside", "place", "write_file", "MANIFEST"]
