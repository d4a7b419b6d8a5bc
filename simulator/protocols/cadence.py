"""When a run evaluates the test error: every ``samples_per_epoch / evals_per_epoch`` samples.

The rule, for every protocol and every backend that writes a trace: after an update that
brings the samples applied so far to ``s``, an eval is due when ``s`` has reached the next
mark (within 1e-9, float marks); the mark then moves past ``s``. A run also evaluates at
t = 0 and at its end (the engines add those).
"""

from __future__ import annotations


class EvalCadence:
    """The next evaluation mark; ``due(samples)`` says whether an eval is due now and moves it.

    ``end``: the samples of the whole run; an eval due exactly there is left to the run's final
    eval (decentralized runs: after the last update, messages still mix in).
    """

    __slots__ = ("every", "next", "end")

    def __init__(self, samples_per_epoch: int, evals_per_epoch: int, end: float | None = None) -> None:
        self.every = samples_per_epoch / evals_per_epoch
        self.next = self.every
        self.end = end

    def due(self, samples: float) -> bool:
        """True when ``samples`` reached the next mark (and ``end`` is not reached): the mark moves on."""
        if samples < self.next - 1e-9 or (self.end is not None and samples >= self.end):
            return False
        while self.next <= samples + 1e-9:
            self.next += self.every
        return True
