"""The result table the commands print: columns, number formats, durations."""

from __future__ import annotations

import math
import sys
from typing import Any


def _fmt(v: Any, width: int = 10) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}"
    return str(v)


def duration(seconds: float) -> str:
    """Seconds in the unit a reader wants: s, min or h."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or math.isnan(seconds):
        return _fmt(seconds)
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.4g} s"


LEAD_KEYS = ("run_id", "protocol", "learners", "minibatch")


def print_table(records: list[dict[str, Any]], columns: list[tuple[str, str]], file: Any = None,
                lead: int = 4) -> None:
    """Print result rows as an aligned text table (``columns`` = (key, heading)); the first
    ``lead`` columns identify the run; a failed run shows FAILED in the first result column."""
    file = file or sys.stdout

    def cell(r: dict[str, Any], i: int, k: str) -> str:
        if r["row"].get("error") is not None and i >= lead:
            return "FAILED" if i == lead else ""
        v = r["row"].get(k)
        return duration(v) if k in TIME_KEYS and v is not None else _fmt(v)

    rows = [[cell(r, i, k) for i, (k, _) in enumerate(columns)] for r in records]
    heads = [h for _, h in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)), file=file)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)), file=file)
    for r in records:
        if r["row"].get("error"):
            print(f"run {r['row']['run_id']} failed: {r['row']['error']}", file=file)


TIME_KEYS = ("sim_time_s", "measured_time_s", "time_to_target_s")
SIM_TABLE = [("run_id", "run"), ("protocol", "protocol"), ("learners", "λ"), ("minibatch", "μ"),
             ("sim_time_s", "time"), ("gradients_per_s", "grad/s"), ("staleness_mean", "σ mean"),
             ("staleness_max", "σ max"), ("server_utilization", "server util"),
             ("link_in_utilization", "NIC in util"), ("link_out_utilization", "NIC out util")]
# (the busiest of the server's apply queue and NICs, or of the nodes' NICs, bounds the run: a
# server idle at 0.003 beside a NIC in at 1.0 is network-bound)
RUN_TABLE = SIM_TABLE[:6] + [("staleness_mean", "σ mean"), ("final_test_error", "final err"),
                             ("best_test_error", "best err"), ("time_to_target_s", "to target"),
                             ("diverged", "diverged"), ("did_not_learn", "did not learn")]
