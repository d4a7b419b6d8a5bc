"""Compute time of a minibatch: the mean, its distribution, stragglers and stalls.

Mean time per minibatch is ``base_s + per_sample_s × μ`` or, with a calibrated
profile, the table interpolated linearly in μ (extrapolated from the end segments).
Each learner draws from its own seeded stream, so its compute times do not depend on
what other learners do; persistent stragglers multiply their mean by ``slowdown``;
transient stalls (Poisson arrivals, exponential durations) pause a learner's work.
"""

from __future__ import annotations

import math
import tomllib
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import seeds
from .files import FileRefused, read_bounded

CHUNK = 4096
PROFILE_MAX_BYTES = 1 << 20


class ProfileError(ValueError):
    """A calibrated profile file that is missing or malformed."""


def load_profile(path: str | Path) -> tuple[list[int], list[float]]:
    """Read a profile TOML (``minibatch = [...]``, ``seconds = [...]``); sorted by μ."""
    p = Path(path)
    try:
        data = tomllib.loads(read_bounded(p, PROFILE_MAX_BYTES, "compute profile").decode("utf-8-sig"))
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such compute profile") from None
    except FileRefused as e:
        raise ProfileError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{p}: cannot read compute profile: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{p}: invalid TOML: {e}") from None
    mb, sec = data.get("minibatch"), data.get("seconds")
    if not isinstance(mb, list) or not isinstance(sec, list) or len(mb) != len(sec) or not mb:
        raise ProfileError(f"{p}: needs equal-length non-empty arrays 'minibatch' and 'seconds'")
    for m, s in zip(mb, sec):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ProfileError(f"{p}: key 'minibatch' = {m!r}: must be integers ≥ 1")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise ProfileError(f"{p}: key 'seconds' = {s!r}: must be finite numbers > 0")
    pairs = sorted(zip(mb, (float(s) for s in sec)))
    if len({m for m, _ in pairs}) != len(pairs):
        raise ProfileError(f"{p}: key 'minibatch' has repeated sizes")
    return [m for m, _ in pairs], [s for _, s in pairs]


def profile_mean(minibatches: list[int], seconds: list[float], mu: int) -> float:
    """Seconds per minibatch of size ``mu``: piecewise-linear in μ, floored at 1% of the smallest."""
    if len(minibatches) == 1:
        return seconds[0] * mu / minibatches[0]
    i = int(np.searchsorted(minibatches, mu))
    i = min(max(i, 1), len(minibatches) - 1)
    m0, m1, s0, s1 = minibatches[i - 1], minibatches[i], seconds[i - 1], seconds[i]
    value = s0 + (s1 - s0) * (mu - m0) / (m1 - m0)
    return max(value, 0.01 * min(seconds))


def mean_compute_s(compute: dict[str, Any], mu: int) -> float:
    """Mean seconds per minibatch of ``mu`` samples for a ``cluster.compute`` table."""
    if compute.get("profile"):
        return profile_mean(*load_profile(compute["profile"]), mu)
    return compute["base_s"] + compute["per_sample_s"] * mu


def sampler(distribution: str, mean: float, cv: float, rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    """A function ``n -> n draws`` with the given mean (lognormal: coefficient of variation cv)."""
    if distribution == "deterministic" or mean == 0:
        return lambda n: np.full(n, mean)
    if distribution == "exponential":
        return lambda n: rng.exponential(mean, n)
    if distribution == "lognormal":
        if cv == 0:
            return lambda n: np.full(n, mean)
        s2 = math.log1p(cv * cv)
        mu_log, sigma = math.log(mean) - s2 / 2, math.sqrt(s2)
        return lambda n: rng.lognormal(mu_log, sigma, n)
    raise ValueError(f"unknown distribution {distribution!r}")


class DrawStream:
    """Successive draws from ``fn`` served from a buffer refilled ``chunk`` at a time (the
    values do not depend on the chunk size: NumPy's generators fill arrays sequentially).

    ``next()`` runs in C (a ``partial`` of ``next`` over a chain of the chunks' lists): no
    Python frame per draw, one per chunk."""

    __slots__ = ("_fn", "next")

    def __init__(self, fn: Callable[[int], np.ndarray], chunk: int = CHUNK) -> None:
        self._fn = fn
        chunks = iter(lambda: fn(chunk).tolist(), None)  # never None: endless
        self.next: Callable[[], float] = partial(next, chain.from_iterable(chunks))


class LearnerClock:
    """One learner's compute: draws its minibatch times and lets stalls pause the work.

    ``finish(start, work)`` is when ``work`` seconds of computing that begin at ``start``
    end, given the learner's stall intervals (Poisson arrivals, exponential lengths).
    """

    __slots__ = ("draws", "stall_free", "_stall_rate", "_stall_mean", "_rng", "_s", "_e")

    def __init__(self, draws: DrawStream, stall_rate: float, stall_mean: float,
                 rng: np.random.Generator) -> None:
        self.draws = draws
        self._stall_rate, self._stall_mean, self._rng = stall_rate, stall_mean, rng
        self._s = self._e = math.inf
        if stall_rate > 0 and stall_mean > 0:
            self._s = float(rng.exponential(1 / stall_rate))
            self._e = self._s + float(rng.exponential(stall_mean))
        self.stall_free = self._s == math.inf  # finish(start, work) is start + work

    def _advance(self) -> None:
        self._s += float(self._rng.exponential(1 / self._stall_rate))
        self._e = max(self._e, self._s + float(self._rng.exponential(self._stall_mean)))

    def finish_many(self, start: float, marks: list[float]) -> list[float]:
        """When each cumulative amount of work in ``marks`` (ascending) of computing that begins
        at ``start`` is done, stalls applied once (one mark: exactly :meth:`finish`)."""
        if self._s == math.inf:
            return [start + m for m in marks]
        out, t, prev = [], start, 0.0
        for m in marks:
            t = self._walk(t, m - prev)
            prev = m
            out.append(t)
        return out

    def finish(self, start: float, work: float) -> float:
        """When ``work`` seconds of computing that begins at ``start`` is done, stalls applied."""
        if self._s == math.inf:
            return start + work
        return self._walk(start, work)

    def _walk(self, t: float, left: float) -> float:
        """The rule: computing pauses from each stall's start to its end; ``left`` seconds of
        it from ``t`` end at the returned time (the stall stream advanced past it)."""
        while True:
            while self._e <= t:
                self._advance()
            if self._s <= t:
                t = self._e
                self._advance()
                continue
            if t + left <= self._s:
                return t + left
            left -= self._s - t
            t = self._e
            self._advance()


def _streams(point: dict[str, Any], count: int) -> list[np.random.SeedSequence]:
    return np.random.SeedSequence([int(point["seed"]), seeds.CLOCKS]).spawn(count + 1)


def stragglers(point: dict[str, Any], count: int) -> set[int]:
    """The persistently slow learners: ``round(fraction × count)`` of them, chosen by the seed."""
    fraction = point["cluster"]["stragglers"]["fraction"]
    pick = _streams(point, count)[0]
    return set(np.random.default_rng(pick).permutation(count)[: round(fraction * count)].tolist())


def learner_clocks(point: dict[str, Any], count: int) -> list[LearnerClock]:
    """Per-learner clocks for a scenario point; persistent stragglers chosen by the seed.

    The same point gives the same clocks in the simulator and the live backend (one seed
    tag, :data:`.seeds.CLOCKS`), whatever the protocol."""
    cl = point["cluster"]
    comp, strag = cl["compute"], cl["stragglers"]
    mean = mean_compute_s(comp, cl["minibatch"])
    streams = _streams(point, count)[1:]
    slow = stragglers(point, count)
    chunk = max(256, min(CHUNK, (1 << 20) // max(1, count)))  # ≤ ~1M buffered draws in all
    clocks = []
    for i, ss in enumerate(streams):
        draw_rng, stall_rng = (np.random.default_rng(s) for s in ss.spawn(2))
        m = mean * (strag["slowdown"] if i in slow else 1.0)
        fn = sampler(comp["distribution"], m, comp["cv"], draw_rng)
        clocks.append(LearnerClock(DrawStream(fn, chunk), strag["stall_rate_per_s"], strag["stall_mean_s"], stall_rng))
    return clocks
