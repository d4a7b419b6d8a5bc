"""Fault injection and progress beats of live processes.

* :func:`fail_if_due`: ``live.fail_learner`` makes that learner fail after
  ``live.fail_after`` gradients, as ``live.fail_mode`` says: ``kill`` (it kills itself) or
  ``hang`` (it keeps running and never answers again: what a deadlock or a stuck device
  looks like from outside).
* :class:`Heartbeat`: a gossip node records how many gradients it has finished, and when, in
  a 16-byte file of the run's scratch folder; when a collective times out, the parent names
  the node that fell behind (:func:`laggards`). The parameter server needs no beat: it names a
  silent learner itself (``live_ps.silent_learner``).
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

BEAT = struct.Struct("<qd")  # gradients finished, time.monotonic() of the last one


def fail_if_due(live: dict[str, Any], index: int, done: int) -> None:
    """Fail now when ``index`` is ``live.fail_learner`` and ``done`` ≥ ``live.fail_after``."""
    if live["fail_learner"] != index or done < live["fail_after"]:
        return
    if live.get("fail_mode", "kill") == "hang":
        while True:
            time.sleep(3600)
    os.kill(os.getpid(), 9)


class Heartbeat:
    """Node ``rank``'s progress file ``progress.<rank>`` in ``folder``, rewritten in place."""

    def __init__(self, folder: str, rank: int) -> None:
        self.fd = os.open(os.path.join(folder, f"progress.{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.beat(0)

    def beat(self, done: int) -> None:
        os.pwrite(self.fd, BEAT.pack(done, time.monotonic()), 0)


def read_beats(folder: str, ranks: int) -> list[tuple[int, float] | None]:
    """Each rank's (gradients finished, time of the last), None where unreadable."""
    out: list[tuple[int, float] | None] = []
    for r in range(ranks):
        try:
            with open(os.path.join(folder, f"progress.{r}"), "rb") as f:
                data = f.read(BEAT.size)
            out.append(BEAT.unpack(data) if len(data) == BEAT.size else None)
        except OSError:
            out.append(None)
    return out


def laggards(beats: list[tuple[int, float] | None]) -> tuple[list[int], int, int, float]:
    """(the ranks behind every other, their count, the others' least count, when the laggards
    last progressed); no ranks when nobody is behind or a beat is missing."""
    if not beats or any(b is None for b in beats):
        return [], 0, 0, 0.0
    counts = [b[0] for b in beats]  # type: ignore[index]
    lo = min(counts)
    behind = [r for r, c in enumerate(counts) if c == lo]
    if len(behind) == len(counts):
        return [], lo, lo, 0.0
    others = min(c for c in counts if c != lo)
    return behind, lo, others, max(beats[r][1] for r in behind)  # type: ignore[index]
