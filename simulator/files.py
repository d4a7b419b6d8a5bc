"""Writing result files: one atomic write for every file ddlsim produces.

Readers see the old file or the whole new one, never half: the data goes to a temporary
file in the target's folder, is flushed to disk, made readable by the group and others
(0644, like any file a user writes under a default umask: colleagues on a shared cluster
read the tables) and renamed over the target.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FILE_MODE = 0o644


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically, mode 0644; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
