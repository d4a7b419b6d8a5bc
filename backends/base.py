"""The backend interface: a backend executes a trace and reports accuracy over time.

A backend is a class with a ``name`` and a ``run`` method; it is found by name in the
registry (:mod:`ddlsim.backends.registry`), which also loads third-party backends
from the ``ddlsim.backends`` entry-point group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..simulator.trace import Trace


@dataclass
class RunOptions:
    """How to execute: ``device`` ("cpu", "cuda", or None for cuda-when-available);
    ``threads``: torch's intra-op threads while the backend runs (restored after);
    ``stacked``: the replay path of multi-node traces, "auto" | "on" | "off" (docs/replay.md)."""

    device: str | None = None
    data_dir: str | None = None
    download: bool = False
    batched: bool = True
    threads: int = 1
    stacked: str = "auto"


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
