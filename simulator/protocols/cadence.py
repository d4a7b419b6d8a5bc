"""When a run evaluates the test error: every ``samples_per_epoch / evals_per_epoch`` samples.

The rule, for every protocol and every backend that writes a trace: after an update that
brings the samples applied so far to ``s``, an eval is due when ``s`` has reached the next
mark (within 1e-9, float marks); the mark then moves past ``s``. A run also evaluates at
t = 0 and at its end (the engines add those).
"""

from __future__ import annotations

import math


def next_mark(mark: float, every: float, samples: float, end: float) -> float:
    """The rule: the mark after an update that brought the samples applied to ``samples``. No
    eval is due (the mark stays) while ``samples`` is short of ``mark`` by more than 1e-9, or
    has reached ``end`` (``inf``: no end); otherwise one is, and the mark moves past
    ``samples`` in steps of ``every``. An eval is due exactly when the mark moved. (The fast
    engines compile this function: :func:`..fast_core.cadence_due`.)"""
    if samples < mark - 1e-9 or samples >= end:
        return mark
    while mark <= samples + 1e-9:
        mark += every
    return mark


class EvalCadence:
    """The next evaluation mark; ``due(samples)`` says whether an eval is due now and moves it.

    ``end``: the samples of the whole run; an eval due exactly there is left to the run's final
    eval (decentralized runs: after the last update, messages still mix in).
    """

    __slots__ = ("every", "next", "end", "_end")

    def __init__(self, samples_per_epoch: int, evals_per_epoch: int, end: float | None = None) -> None:
        self.every = samples_per_epoch / evals_per_epoch
        self.next = self.every
        self.end = end
        self._end = math.inf if end is None else end

    def due(self, samples: float) -> bool:
        """True when ``samples`` reached the next mark (and ``end`` is not reached): the mark
        moves on (:func:`next_mark`)."""
        mark = next_mark(self.next, self.every, samples, self._end)
        if mark == self.next:
            return False
        self.next = mark
        return True
