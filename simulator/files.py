"""Files ddlsim writes and reads: one atomic write, one bounded read.

Writes: readers see the old file or the whole new one, never half: the data goes to a
temporary file in the target's folder, is flushed to disk, made readable by the group and
others (0644, like any file a user writes under a default umask: colleagues on a shared
cluster read the tables) and renamed over the target. A target that is a symbolic link, a
device, a FIFO or a directory is refused (:class:`FileRefused`): renaming over it would
replace the link or the device with a regular file.

Reads: :func:`read_bounded` reads a file only after checking that it is a regular file (not
a FIFO, a device or ``/dev/zero``) of at most ``limit`` bytes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from collections.abc import Iterable

FILE_MODE = 0o644
MAX_READ_BYTES = 64 << 20  # default bound of read_bounded
TEMP_MARK = "ddlsim-"  # in every temporary's name (.NAME.ddlsim-XXXXXXXX.tmp): never a user's file


class FileRefused(OSError):
    """A file ddlsim will not read or write (special file, link, too large); one line."""


def check_target(path: Path) -> None:
    """Refuse to write over a symbolic link, a device, a FIFO or a directory."""
    if path.is_symlink():
        raise FileRefused(f"{path}: is a symbolic link; ddlsim writes regular files only (name the target itself)")
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file (a device, FIFO or socket)"
        raise FileRefused(f"{path}: is {kind}; ddlsim writes regular files only")


def read_bounded(path: str | os.PathLike[str], limit: int = MAX_READ_BYTES, what: str = "file") -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``limit`` bytes; else a one-line
    :class:`FileRefused` (``FileNotFoundError`` when it does not exist)."""
    p = Path(path)
    st = os.stat(p)  # FileNotFoundError propagates: callers word it
    import stat as _stat

    if not _stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{p}: not a regular file (a {what} must be one)")
    if st.st_size > limit:
        raise FileRefused(f"{p}: {st.st_size:,} bytes is more than the {limit:,} a {what} may have")
    with open(p, "rb") as f:
        data = f.read(st.st_size + 1)  # (a read of `limit` would allocate `limit` bytes up front)
    if len(data) > limit:
        raise FileRefused(f"{p}: more than the {limit:,} bytes a {what} may have")
    return data


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Iterable[bytes]) -> Path:
    """Write ``data`` (text is UTF-8; an iterable of byte strings is written piece by piece)
    to ``path`` atomically, mode 0644; return the path."""
    path = Path(path)
    check_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{TEMP_MARK}", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, (bytes, bytearray, memoryview, str)):
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            else:
                for piece in data:
                    f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
