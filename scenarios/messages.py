"""How a one-line message shows text it did not write (file names, keys, values)."""

from __future__ import annotations


def escape(text: str) -> str:
    """``text`` with control characters (newlines, terminal escapes) written as escapes."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
