"""numba's disk cache of the fast engines, kept in step with every source they are built from.

numba checks a cached function against the one file that defines it, so a kernel that calls
or inlines a helper of another module (``fast_ps`` → ``fast_core`` → ``protocols/cadence``)
keeps the old helper's code after that module is edited. The rule kept here: beside each
cache folder lies a stamp, the SHA-256 of the fast engines' sources — every ``fast_*.py`` of
this package and, transitively, each package module they import (read from their import
statements, not from a list that could go stale). When the stamp differs from the sources,
every cached kernel in that folder is dropped (they compile again once) and the stamp is
rewritten. Cheap: it reads the sources and lists folders; it imports no numba.

The folders are numba's own choice (``numba.core.caching``): ``NUMBA_CACHE_DIR/<dir>_<sha1 of
the source folder>`` when that variable is set; else ``__pycache__`` beside the source, or,
when the package is not writable, ``~/.cache/numba/<dir>_<sha1>`` (``XDG_CACHE_HOME`` if set).
Paths are taken as numba takes them, absolute but with links unresolved. A cache folder that
is itself a symbolic link is left alone (nothing is deleted through a link).
"""

from __future__ import annotations

import ast
import hashlib
import os
from pathlib import Path

STAMP = "ddlsim-kernels.stamp"
CACHE_SUFFIXES = (".nbi", ".nbc")
HERE = Path(os.path.abspath(__file__)).parent  # as numba names it: the import path, links not resolved


def engine_sources(root: Path = HERE) -> list[Path]:
    """``root``'s ``fast_*.py`` and every module below ``root`` they import, directly or not
    (relative imports only: ``from . import x``, ``from .x import y``, ``from .p import m``),
    sorted by path."""
    todo = sorted(root.glob("fast_*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        todo.extend(_imported(path, root))
    return sorted(seen)


def _imported(path: Path, root: Path) -> list[Path]:
    """The package modules below ``root`` that ``path``'s relative imports name."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        parts = node.module.split(".") if node.module else []
        target = base.joinpath(*parts)
        candidates = [target.with_suffix(".py"), target / "__init__.py"]
        candidates += [target / f"{alias.name}.py" for alias in node.names]  # from .pkg import module
        found += [Path(os.path.normpath(c)) for c in candidates if c.is_file()]
    return [c for c in found if root in c.parents]


def sources_digest(sources: list[Path], root: Path = HERE) -> str:
    """SHA-256 over each source's path (relative to ``root``) and bytes, in the given order."""
    h = hashlib.sha256()
    for path in sources:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_folders(source_dirs: list[Path]) -> list[Path]:
    """Where numba keeps the cache of functions defined in ``source_dirs`` (its locator order)."""
    def subpath(folder: Path) -> str:
        path = os.path.abspath(folder)
        return f"{os.path.split(path)[-1]}_{hashlib.sha1(path.encode()).hexdigest()}"
    if os.environ.get("NUMBA_CACHE_DIR"):
        return [Path(os.environ["NUMBA_CACHE_DIR"]) / subpath(d) for d in source_dirs]
    out = []
    for d in source_dirs:
        out.append(d / "__pycache__")
        if not os.access(d, os.W_OK):
            user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"
            out.append(user / subpath(d))
    return out


def refresh(root: Path = HERE) -> list[Path]:
    """Drop numba's cached kernels in every cache folder whose stamp is not the digest of the
    fast engines' current sources, and stamp it; the files dropped. A folder that does not
    exist or cannot be written is left as it is (numba will not use it either)."""
    sources = engine_sources(root)
    if not sources:
        return []
    digest = sources_digest(sources, root)
    dropped: list[Path] = []
    for folder in cache_folders(sorted({p.parent for p in sources})):
        stamp = folder / STAMP
        try:
            if not folder.is_dir() or folder.is_symlink() or (stamp.is_file() and stamp.read_text() == digest):
                continue
            for f in folder.iterdir():
                if f.suffix in CACHE_SUFFIXES and f.is_file() and not f.is_symlink():
                    f.unlink(missing_ok=True)
                    dropped.append(f)
            tmp = folder / f".{STAMP}.{os.getpid()}.tmp"
            tmp.write_text(digest)
            os.replace(tmp, stamp)
        except OSError:
            continue
    return dropped
