"""The backend interface: a backend executes a trace and reports accuracy over time.

A backend is a class with a ``name`` and a ``run`` method; it is found by name in the
registry (:mod:`ddlsim.backends.registry`), which also loads third-party backends
from the ``ddlsim.backends`` entry-point group.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from collections.abc import Callable

from ..simulator.trace import Trace

# progress(stage, done, total, unit), e.g. ("replay", 3.0, 20.0, "epochs"): how far a backend got
ProgressFn = Callable[[str, float, float, str], None]


@dataclass
class RunOptions:
    """How to execute: ``device`` ("cpu", "cuda", or None for cuda-when-available);
    ``threads``: torch's intra-op threads while the backend runs (restored after);
    ``stacked``: the replay path of multi-node traces, "auto" | "on" | "off" (docs/replay.md);
    ``progress``: called as the run advances (:data:`ProgressFn`; None: nobody is told)."""

    device: str | None = None
    data_dir: str | None = None
    download: bool = False
    batched: bool = True
    threads: int = 1
    stacked: str = "auto"
    progress: ProgressFn | None = None


LINE_EVERY_S = 30.0  # a plain progress line of one point (stderr not a terminal) at most this often
LINES = "lines"      # PointProgress mode: plain lines on stderr


class PointProgress:
    """One point's progress within its run, where the sweep shows it: ``mode`` is
    :data:`LINES` (stderr is not a terminal: a plain line ``  RUN_ID: replay 3/20 epochs`` at
    most every :data:`LINE_EVERY_S` seconds, never a carriage return) or the sweep's channel
    folder (its bar reads the file ``RUN_ID`` there, replaced whole at every report; a folder
    that is not there, e.g. on another machine, is not written)."""

    def __init__(self, mode: str, run_id: str) -> None:
        self.mode, self.run_id = mode, run_id
        self._last = time.monotonic()
        self._dead = False

    def __call__(self, stage: str, done: float, total: float, unit: str) -> None:
        text = f"{stage} {done:g}/{total:g} {unit}"
        if self.mode == LINES:
            now = time.monotonic()
            if now - self._last >= LINE_EVERY_S:
                self._last = now
                print(f"  {self.run_id}: {text}", file=sys.stderr, flush=True)
            return
        if self._dead:
            return
        path = Path(self.mode) / self.run_id
        tmp = path.with_name(f".{self.run_id}.{os.getpid()}")
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError:
            self._dead = True

    def close(self) -> None:
        """The point is done: its entry leaves the channel."""
        if self.mode != LINES:
            try:
                (Path(self.mode) / self.run_id).unlink(missing_ok=True)
            except OSError:
                pass


def read_channel(folder: str | os.PathLike[str]) -> dict[str, str]:
    """What the points running now last reported into the channel ``folder``: run id → text."""
    out: dict[str, str] = {}
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        if e.name.startswith("."):
            continue
        try:
            with open(e.path, "rb") as f:
                out[e.name] = f.read(256).decode("utf-8", "replace")
        except OSError:
            continue
    return out


@dataclass
class BackendResult:
    """What a backend measured.

    ``curves``: one dict per evaluation with keys ``epoch``, ``updates``, ``sim_time_s``,
    ``test_error``, ``train_loss`` (and optionally ``consensus_distance``).
    ``summary``: ``final_test_error``, ``best_test_error``, ``time_to_target_s`` (None if
    never reached), ``diverged`` (bool), ``diverged_at_update`` (None or int), ``did_not_learn``
    (bool: no better than chance, or than the first evaluation; see ``replay.did_not_learn``).
    ``trace``: a measured trace, for backends that produce one (live); else None.
    ``final_weights``: the flat parameters each node ended with, where the backend knows
    them (live: the server's, or every node's).
    """

    curves: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    trace: Trace | None = None
    final_weights: Any = None


class Backend(Protocol):
    """A trace executor. ``point`` is the validated scenario point (nested dict)."""

    name: str

    def run(self, trace: Trace, point: dict[str, Any], options: RunOptions) -> BackendResult: ...


class BackendError(RuntimeError):
    """A backend cannot run this point (missing data, unsupported model); one clear line."""
