"""Compute time of a minibatch: the mean, its distribution, stragglers and stalls.

Mean time per minibatch is ``base_s + per_sample_s × μ`` or, with a calibrated
profile, the table interpolated linearly in μ (extrapolated from the end segments).
Each learner draws from its own seeded stream, so its compute times do not depend on
what other learners do; persistent stragglers multiply their mean by ``slowdown``;
transient stalls (Poisson arrivals, exponential durations) pause a learner's work.
"""

from __future__ import annotations

import math
import sys
import tomllib
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np

from . import seeds
from .files import FileRefused, read_bounded

PROFILE_HEAD = "# ddlsim compute profile"  # the first line of every profile calibrate writes
CHUNK = 4096
PROFILE_MAX_BYTES = 1 << 20
MAX_MINIBATCH = 10**7   # the largest μ a scenario or a profile may name
MAX_SECONDS = 1e6       # the longest mean time of a minibatch a profile may give


class ProfileError(ValueError):
    """A calibrated profile file that is missing or malformed."""


def read_profile_toml(p: Path, kind: str = "compute profile") -> dict[str, Any]:
    """The TOML of the profile file ``p`` (a regular file of at most PROFILE_MAX_BYTES), or one
    ProfileError line naming it (``kind``: "compute profile", "network profile")."""
    try:
        return tomllib.loads(read_bounded(p, PROFILE_MAX_BYTES, kind).decode("utf-8-sig"))
    except FileNotFoundError:
        raise ProfileError(f"{p}: no such {kind}") from None
    except FileRefused as e:
        raise ProfileError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{p}: cannot read {kind}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{p}: invalid TOML: {e}") from None
    except ValueError:  # tomllib's only other ValueError: an integer longer than Python converts
        raise ProfileError(f"{p}: an integer of more than {sys.get_int_max_str_digits():,} digits") from None
    except RecursionError:
        raise ProfileError(f"{p}: invalid TOML: arrays or tables nested too deeply") from None


def _as_float(x: Any) -> float | None:
    """``x`` as a float if it is a number that is one (not NaN, not an integer beyond floats)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        number = float(x)
    except OverflowError:
        return None
    return None if math.isnan(number) else number


def magnitude(value: int) -> str:
    """An integer of any size as ``d.dde+N`` (three digits), computed from its bits: never the
    decimal conversion Python refuses beyond 4,300 digits, never a float overflow."""
    a = abs(value)
    if a < 10**15:
        return str(value)
    shift = max(0, a.bit_length() - 64)
    exp10 = math.log10(a >> shift) + shift * math.log10(2)
    exponent = math.floor(exp10)
    mantissa = round(10 ** (exp10 - exponent), 2)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{'-' if value < 0 else ''}{mantissa:.2f}e+{exponent}"


def load_profile(path: str | Path) -> tuple[list[int], list[float]]:
    """Read a profile TOML's compute table, ``minibatch = [...]`` (integers 1 … MAX_MINIBATCH, no
    size twice) and ``seconds = [...]`` (finite, > 0, ≤ MAX_SECONDS, so that its extrapolation
    to any μ a scenario may name stays finite), sorted by μ; one line naming the file and the
    key otherwise."""
    p = Path(path)
    if "\0" in str(path):
        raise ProfileError(f"{str(path)!r}: not a file name (it holds a NUL byte)")
    data = read_profile_toml(p)
    mb, sec = data.get("minibatch"), data.get("seconds")
    if not isinstance(mb, list) or not isinstance(sec, list) or len(mb) != len(sec) or not mb:
        raise ProfileError(f"{p}: needs equal-length non-empty arrays 'minibatch' and 'seconds'")
    for m, s in zip(mb, sec):
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_MINIBATCH:
            raise ProfileError(f"{p}: key 'minibatch' = {_show(m)}: must be integers ≥ 1, ≤ {MAX_MINIBATCH:.0e}")
        if (number := _as_float(s)) is None or not 0 < number <= MAX_SECONDS:
            raise ProfileError(f"{p}: key 'seconds' = {_show(s)}: must be finite numbers > 0, ≤ {MAX_SECONDS:g}")
    pairs = sorted(zip(mb, (float(s) for s in sec)))
    if len({m for m, _ in pairs}) != len(pairs):
        raise ProfileError(f"{p}: key 'minibatch' has repeated sizes")
    return [m for m, _ in pairs], [s for _, s in pairs]


def _show(value: Any) -> str:
    """A profile value as a message shows it: a huge integer by its magnitude, never whole."""
    if isinstance(value, int) and not isinstance(value, bool):
        return magnitude(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


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
    ``rng``, the stalls' generator, may be given as a function that makes it: it is then
    called when a stall is first drawn (a learner without stalls makes none).
    """

    __slots__ = ("draws", "stall_free", "_stall_rate", "_stall_mean", "_gen", "_make", "_s", "_e")

    def __init__(self, draws: DrawStream, stall_rate: float, stall_mean: float,
                 rng: np.random.Generator | Callable[[], np.random.Generator]) -> None:
        self.draws = draws
        self._stall_rate, self._stall_mean = stall_rate, stall_mean
        self._gen: np.random.Generator | None = None
        self._make: Callable[[], np.random.Generator] | None = None
        if isinstance(rng, np.random.Generator):
            self._gen = rng
        else:
            self._make = rng
        self._s = self._e = math.inf
        if stall_rate > 0 and stall_mean > 0:
            self._s = float(self._rng.exponential(1 / stall_rate))
            self._e = self._s + float(self._rng.exponential(stall_mean))
        self.stall_free = self._s == math.inf  # finish(start, work) is start + work

    @property
    def _rng(self) -> np.random.Generator:
        """The stalls' generator (made on first use)."""
        if self._gen is None:
            assert self._make is not None
            self._gen = self._make()
        return self._gen

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


def _clock_seed(point: dict[str, Any]) -> np.random.SeedSequence:
    return np.random.SeedSequence([int(point["seed"]), seeds.CLOCKS])


def _descendant(root: np.random.SeedSequence, *path: int) -> np.random.SeedSequence:
    """``root.spawn(i + 1)[i].spawn(j + 1)[j]…`` for ``path = (i, j, …)`` of a root that spawned
    none, made directly (NumPy's rule: a child's spawn key is its parent's and its index), the
    siblings neither made nor counted on ``root``."""
    return np.random.SeedSequence(root.entropy, spawn_key=root.spawn_key + path, pool_size=root.pool_size)


def _rng(seed: np.random.SeedSequence) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(seed))  # (np.random.default_rng's generator)


def _stall_rng(root: np.random.SeedSequence, learner: int) -> np.random.Generator:
    return _rng(_descendant(root, learner + 1, 1))


def _chosen(root: np.random.SeedSequence, fraction: float, count: int) -> set[int]:
    k = round(fraction * count)
    return set(_rng(_descendant(root, 0)).permutation(count)[:k].tolist()) if k else set()


def stragglers(point: dict[str, Any], count: int) -> set[int]:
    """The persistently slow learners: ``round(fraction × count)`` of them, chosen by the seed."""
    return _chosen(_clock_seed(point), point["cluster"]["stragglers"]["fraction"], count)


def learner_clocks(point: dict[str, Any], count: int) -> list[LearnerClock]:
    """Per-learner clocks for a scenario point; persistent stragglers chosen by the seed.

    The same point gives the same clocks in the simulator and the live backend (one seed
    tag, :data:`.seeds.CLOCKS`), whatever the protocol. Learner i's streams: child i + 1 of
    the tag's seed, whose children 0 (the compute draws) and 1 (the stalls, its generator made
    only if a stall is drawn); child 0 of the tag's seed picks the stragglers."""
    cl = point["cluster"]
    comp, strag = cl["compute"], cl["stragglers"]
    mean = mean_compute_s(comp, cl["minibatch"])
    root = _clock_seed(point)
    slow = _chosen(root, strag["fraction"], count)
    chunk = max(256, min(CHUNK, (1 << 20) // max(1, count)))  # ≤ ~1M buffered draws in all
    clocks = []
    for i in range(count):
        m = mean * (strag["slowdown"] if i in slow else 1.0)
        fn = sampler(comp["distribution"], m, comp["cv"], _rng(_descendant(root, i + 1, 0)))
        clocks.append(LearnerClock(DrawStream(fn, chunk), strag["stall_rate_per_s"], strag["stall_mean_s"],
                                   partial(_stall_rng, root, i)))
    return clocks
