"""The key reference of docs/scenarios.md, from the schema.

    python -m ddlsim.scenarios.docgen                       # print the table
    python -m ddlsim.scenarios.docgen --write docs/scenarios.md   # replace the table in the file
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from .schema import FIELDS

HEAD = "| key | type | unit | default | range | meaning |"


def _default(value: object) -> str:
    if value is None:
        return "derived"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value).replace("'", '"')


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference() -> str:
    """The Markdown table of every key: type, unit, default, range and meaning."""
    lines = [HEAD, "|---|---|---|---|---|---|"]
    for f in FIELDS:
        rng = f.range_text() if f.kind != "list" else "see below"
        lines.append(f"| `{f.key}` | {f.kind} | {f.unit or ''} | `{_default(f.default)}` | "
                     f"{_cell(rng)} | {_cell(f.doc)} |")
    return "\n".join(lines) + "\n"


def write(path: Path) -> None:
    """Replace the key table in ``path`` (from its header line to the end of the table)."""
    text = path.read_text(encoding="utf-8")
    start = text.index(HEAD)
    end = start
    for line in text[start:].splitlines(keepends=True):
        if not line.startswith("|"):
            break
        end += len(line)
    path.write_text(text[:start] + reference() + text[end:], encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write(Path(sys.argv[2]))
    else:
        print(reference(), end="")
