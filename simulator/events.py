"""The lightest event SimPy's scheduler can run: a callback and a value at a time.

The engines schedule a :class:`Wake` per state change instead of creating processes or
``Timeout`` objects; SimPy's ``Environment.step`` pops it in (time, FIFO) order and calls
its callback with it, exactly as for a triggered ``simpy.Event``.
"""

from __future__ import annotations

from typing import Any, Callable

import simpy
from simpy.core import NORMAL


class Wake:
    """A triggered event carrying ``value`` whose only callback is ``cb``."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self, cb: Callable[["Wake"], None], value: Any) -> None:
        self.callbacks: list[Callable[["Wake"], None]] | None = [cb]
        self._ok = True
        self._value = value

    @property
    def value(self) -> Any:
        return self._value


def at(env: simpy.Environment, t: float, cb: Callable[[Wake], None], value: Any) -> None:
    """Call ``cb(wake)`` at simulated time ``t`` (now, if ``t`` is in the past)."""
    delay = t - env.now
    env.schedule(Wake(cb, value), NORMAL, delay if delay > 0 else 0.0)  # type: ignore[arg-type]
