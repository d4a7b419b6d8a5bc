"""Write the key reference of docs/scenarios.md from the schema: ``python -m ddlsim.scenarios.docgen``."""

from __future__ import annotations

import math

from .schema import FIELDS


def _default(value: object) -> str:
    if value is None:
        return "derived"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value).replace("'", '"')


def reference() -> str:
    """The Markdown table of every key: type, unit, default, range and meaning."""
    lines = ["| key | type | unit | default | range | meaning |", "|---|---|---|---|---|---|"]
    for f in FIELDS:
        lines.append(f"| `{f.key}` | {f.kind} | {f.unit or ''} | `{_default(f.default)}` | "
                     f"{f.range_text() if f.kind != 'list' else 'see below'} | {f.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
