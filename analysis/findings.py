"""What a sweep found, in words: the sentences the report (and ``ddlsim run``) lead with.

Pure functions of summary rows (and, for times to an error other than the target, the
curves). Rules every finding keeps:

* it is read from the runs of each configuration (its replicates: the seeds ``seed, seed + 1,
  …``) and is made only if it holds in every replicate; its numbers are ranges over the seeds
  ("2.2–3.1 % over 3 seeds"); one that holds in some seeds only says so, or is left out;
* speed is compared as the time to the same error, seed by seed: the target error when both
  configurations reach it in every seed, else the higher of their mean final errors; never
  the length of the runs;
* a finding about a λ names every μ run at that λ;
* errors at most ``TIE_SAMPLES`` test samples apart are noise, and are said to be;
* nothing is guessed: without both learning-rate policies, a clear trend or enough
  configurations, the finding is left out.

Ties are broken the same way everywhere: the lower value, then the shorter simulated time,
then the label.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .metrics import configuration_row, replicate_groups, within_intervals
from .table import config_key, format_cell, is_number, is_value, label, varying_keys

Row = Mapping[str, Any]
LR_POLICY = "optimizer.lr_policy"
AWARE = ("per_gradient", "mean_staleness")  # staleness-aware learning-rate policies
AWARE_TEXT = {"per_gradient": "dividing the rate by each gradient's staleness",
              "mean_staleness": "dividing the rate by the mean staleness"}
STALE_PROTOCOLS = ("softsync", "async")  # where μλ is not simply the minibatch of one SGD
MIN_ETA_SQUARED = 0.8  # "error tracks μλ" is said only when μλ explains this share in every seed
TIE_SAMPLES = 2  # final errors this many test samples apart are one result: the noise of the test set


def pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def secs(v: float) -> str:
    return f"{v:.3g} s"


def span(values: Sequence[float], fmt: Callable[[float], str] = pct) -> str:
    """``values`` as their range, ``"2.2–3.1 %"`` (``"2.2 %"`` when both ends read the same)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    if lo == hi:
        return lo
    unit = lo.rsplit(" ", 1)
    if len(unit) == 2 and hi.endswith(" " + unit[1]):
        return f"{unit[0]}–{hi}"
    return f"{lo}–{hi}"


def over(n: int) -> str:
    """``" over 3 seeds"``; nothing for one run."""
    return f" over {n} seeds" if n > 1 else ""


def listing(items: Sequence[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def learned(r: Row) -> bool:
    """A run that produced a usable model: it has a final error, did not diverge and learned."""
    return is_number(r.get("final_test_error")) and r.get("diverged") is not True \
        and r.get("did_not_learn") is not True


def tie_width(test_size: int | None) -> float:
    """How far apart two test errors may lie and still be tied: ``TIE_SAMPLES`` test samples
    (``TIE_SAMPLES / test_size``), or 0 (equal only) when the test set's size is unknown."""
    return TIE_SAMPLES / test_size if test_size else 0.0


# -- configurations and their replicates ------------------------------------------------------
@dataclass
class Config:
    """One configuration: its runs (replicates, one per seed) that did not fail."""

    key: tuple
    runs: list[Row]

    @property
    def head(self) -> Row:
        return self.runs[0]

    @property
    def n(self) -> int:
        return len(self.runs)

    def get(self, col: str) -> Any:
        return self.head.get(col)

    def values(self, col: str) -> list[float]:
        return [r[col] for r in self.runs if is_number(r.get(col))]

    def mean(self, col: str) -> float:
        v = self.values(col)
        return math.fsum(v) / len(v) if v else math.nan

    def all_learned(self) -> bool:
        return all(learned(r) for r in self.runs)

    def none_learned(self) -> bool:
        return not any(learned(r) for r in self.runs)

    def learned_count(self) -> int:
        return sum(learned(r) for r in self.runs)

    def by_seed(self) -> dict[Any, Row]:
        return {r.get("seed"): r for r in self.runs}


def configs_of(rows: Iterable[Row]) -> list[Config]:
    """The configurations of ``rows`` (:func:`.metrics.replicate_groups`), failed runs left out."""
    out = []
    for key, runs in replicate_groups(r for r in rows if not r.get("error")).items():
        out.append(Config(key, list(runs)))
    return out


def _without(c: Config, *cols: str) -> tuple:
    return config_key(c.head, omit=cols)


def _lam_mu(c: Config) -> tuple[float, float]:
    return c.get("learners"), c.get("minibatch")


# -- time to the same error -------------------------------------------------------------------
def curve_index(curves: Iterable[Row] | None) -> dict[str, list[tuple[float, float]]]:
    """``run_id`` → its evaluations ``(sim_time_s, test_error)`` in time order."""
    out: dict[str, list[tuple[float, float]]] = {}
    for c in curves or ():
        if is_number(c.get("sim_time_s")) and is_number(c.get("test_error")):
            out.setdefault(str(c.get("run_id")), []).append((c["sim_time_s"], c["test_error"]))
    return {k: sorted(v) for k, v in out.items()}


def time_to(curve: list[tuple[float, float]], level: float) -> float | None:
    """The first simulated time at which the test error is at most ``level`` (None: never)."""
    return next((t for t, e in curve if e <= level + 1e-12), None)


def time_before(curve: list[tuple[float, float]], level: float) -> float:
    """The time of the last evaluation before the error is first at most ``level``: by then it
    was still above (∞ when it never gets there; 0 when the first evaluation is already there)."""
    before = 0.0
    for t, e in curve:
        if e <= level + 1e-12:
            return before
        before = t
    return math.inf


def same_error_times(a: Config, b: Config, curves: dict[str, list[tuple[float, float]]],
                     target: float | None) -> tuple[float, str, list[tuple[float | None, float | None]]] | None:
    """The error both configurations are timed to and, per seed they share, (time of ``a``, time of
    ``b``): the target when every run of both reached it (``time_to_target_s``), else the higher of
    their mean final errors read from the curves. None when there is no such comparison."""
    seeds = [s for s in a.by_seed() if s in b.by_seed()]
    if not seeds:
        return None
    ra, rb = a.by_seed(), b.by_seed()
    if all(is_number(r.get("time_to_target_s")) for s in seeds for r in (ra[s], rb[s])) and target is not None:
        return target, "the target", [(ra[s]["time_to_target_s"], rb[s]["time_to_target_s"]) for s in seeds]
    level = max(a.mean("final_test_error"), b.mean("final_test_error"))
    if not math.isfinite(level):
        return None
    pairs = []
    for s in seeds:
        ca, cb = curves.get(str(ra[s].get("run_id"))), curves.get(str(rb[s].get("run_id")))
        if not ca or not cb:
            return None
        pairs.append((time_to(ca, level), time_to(cb, level)))
    return level, "the higher of their mean final errors", pairs


def speed_text(a_name: str, b_name: str, level: float, why: str,
               pairs: list[tuple[float | None, float | None]]) -> str:
    """``"to 8.0 % (the target), per_gradient takes 0.41–0.49 s and hardsync 0.34–0.40 s:
    hardsync is faster in every seed"`` (or in k of n seeds; never reaching counts as slower)."""
    n = len(pairs)
    inf = math.inf
    a_wins = sum((ta if ta is not None else inf) < (tb if tb is not None else inf) for ta, tb in pairs)
    b_wins = sum((tb if tb is not None else inf) < (ta if ta is not None else inf) for ta, tb in pairs)

    def times(xs: list[float | None]) -> str:
        got = [x for x in xs if x is not None]
        never = len(xs) - len(got)
        text = span(got, secs) if got else "never"
        return text + (f" (never in {never} of {n})" if got and never else "")

    head = (f"to {pct(level)} ({why}), {a_name} takes {times([p[0] for p in pairs])} and {b_name} "
            f"{times([p[1] for p in pairs])}")
    every = "in every seed" if n > 1 else ""
    if a_wins == n:
        verdict = f"{a_name} is faster" + (f" {every}" if every else "")
    elif b_wins == n:
        verdict = f"{b_name} is faster" + (f" {every}" if every else "")
    elif n == 1:
        verdict = "equally fast"
    else:
        verdict = f"neither is faster in every seed ({a_name} in {a_wins}, {b_name} in {b_wins} of {n})"
    return f"{head}: {verdict}"


# -- the findings -------------------------------------------------------------------------------
def staleness_finding(rows: Iterable[Row], curves: Iterable[Row] | None = None,
                      test_size: int | None = None, target: float | None = None) -> str | None:
    """Where a constant learning rate fails under staleness in every seed and a staleness-aware
    one learns in every seed: the λ with the most learners where that happens (then the largest
    gap), with every μ run at that λ, compared with hardsync at the same λ and μ when the sweep
    has it, and, where their errors are alike, in time to the same error."""
    configs = configs_of(rows)
    fams: dict[tuple, dict[str, Config]] = {}
    for c in configs:
        if c.get(LR_POLICY) is not None:
            fams.setdefault(_without(c, LR_POLICY), {})[str(c.get(LR_POLICY))] = c
    cases = []
    for pol in fams.values():
        const = pol.get("constant")
        for name in AWARE:
            aware = pol.get(name)
            if const is None or aware is None or not all(is_number(const.get(k)) for k in ("learners", "minibatch")):
                continue
            sigma = const.values("staleness_mean")
            if not sigma or min(sigma) < 1 or not const.none_learned() or not aware.all_learned():
                continue
            cases.append((const, aware, name))
    if not cases:
        return None
    const, aware, name = max(cases, key=lambda c: (c[0].get("learners"),
                                                   c[0].mean("final_test_error") - c[1].mean("final_test_error")))
    lam = const.get("learners")
    line = _without(const, LR_POLICY, "minibatch")
    by_mu: dict[float, dict[str, Config]] = {}
    for c in configs:
        if c.get(LR_POLICY) in ("constant", name) and _without(c, LR_POLICY, "minibatch") == line:
            by_mu.setdefault(c.get("minibatch"), {})[str(c.get(LR_POLICY))] = c
    mus = sorted(mu for mu, pol in by_mu.items() if "constant" in pol and is_number(mu))
    failing = [mu for mu in mus if by_mu[mu]["constant"].none_learned()]
    n = max(c.n for pol in by_mu.values() for c in pol.values())
    who = label(const.head, keys=[], omit=("learners", "minibatch"))
    fail_runs = [by_mu[mu]["constant"] for mu in failing]
    text = (f"{who} with a constant learning rate does not learn at λ = {lam:g}, μ = "
            f"{listing([f'{mu:g}' for mu in failing])}{f' in any of {n} seeds' if n > 1 else ''} "
            f"({span([e for c in fail_runs for e in c.values('final_test_error')])} test error, ⟨σ⟩ = "
            f"{span([s for c in fail_runs for s in c.values('staleness_mean')], lambda v: f'{v:.3g}')})")
    others = [mu for mu in mus if mu not in failing]
    if others:
        text += "; at " + ", ".join(
            f"μ = {mu:g} it learns in {by_mu[mu]['constant'].learned_count()} of {by_mu[mu]['constant'].n} "
            f"seed{'s' * (by_mu[mu]['constant'].n != 1)} ({span(by_mu[mu]['constant'].values('final_test_error'))})"
            for mu in others)
    hards = _hardsync_at(configs, const)
    width = tie_width(test_size)
    parts, speeds, unhelped = [], [], []
    for mu in failing:
        fix = by_mu[mu].get(name)
        if fix is None:
            continue
        errs = fix.values("final_test_error")
        if fix.none_learned():  # no seed learns with it either: not a fix
            unhelped.append(f"μ = {mu:g} ({span(errs) if errs else 'no error'}, no seed learns)")
            continue
        part = span(errs) if errs else "no error"
        if not fix.all_learned():
            part += f" (it learns in {fix.learned_count()} of {fix.n} seeds)"
        hard = hards.get(mu)
        if hard is not None and hard.values("final_test_error"):
            part += f" (hardsync: {span(hard.values('final_test_error'))}"
            gap = abs(fix.mean("final_test_error") - hard.mean("final_test_error"))
            if width and gap <= width + 1e-12:
                part += f", {TIE_SAMPLES} test samples or fewer apart: noise"
            part += ")"
        parts.append((mu, part))
        alike = hard is not None and fix.all_learned() and hard.all_learned() and (
            within_intervals(configuration_row(fix.runs), configuration_row(hard.runs), width=width)
            or all(is_number(r.get("time_to_target_s")) for r in (*fix.runs, *hard.runs)))
        if alike and hard is not None:
            got = same_error_times(fix, hard, curve_index(curves), target)
            if got is not None:
                speeds.append((mu, speed_text(name, "hardsync", *got)))
    if parts:
        where = len(parts) + len(unhelped) > 1
        text += (f"; {AWARE_TEXT[name]} ({name}) brings it to "
                 + listing([p + (f" at μ = {mu:g}" if where else "") for mu, p in parts]))
    for mu, s in speeds:
        text += f"; at μ = {mu:g}, {s}" if len(parts) > 1 else f"; {s}"
    if unhelped:
        text += f"; it does not help at {listing(unhelped)}"
    return text + "."


def _hardsync_at(configs: list[Config], ref: Config) -> dict[float, Config]:
    """μ → the hardsync configuration at ``ref``'s λ (and its other keys but the learning-rate
    policy, which hardsync's σ = 0 makes moot) with the lowest mean final error."""
    out: dict[float, Config] = {}
    lam = ref.get("learners")
    rest = config_key(ref.head, omit=(LR_POLICY, "protocol", "softsync_n", "minibatch", "learners"))
    for c in configs:
        if c.get("protocol") == "hardsync" and c.get("learners") == lam and \
                config_key(c.head, omit=(LR_POLICY, "protocol", "softsync_n", "minibatch", "learners")) == rest:
            mu = c.get("minibatch")
            if mu not in out or c.mean("final_test_error") < out[mu].mean("final_test_error"):
                out[mu] = c
    return out


def policy_finding(rows: Iterable[Row], test_size: int | None = None) -> str | None:
    """Where both learning-rate policies learn in every seed on stale gradients (⟨σ⟩ > 0): in how
    many configurations the staleness-aware rate lowers the final error in every seed, raises it
    in every seed, or neither (the sign changes between seeds, or the difference is noise), seed
    by seed; said only for sweeps with replicates, where a single seed could mislead."""
    configs = configs_of(rows)
    fams: dict[tuple, dict[str, Config]] = {}
    for c in configs:
        if c.get(LR_POLICY) is not None:
            fams.setdefault(_without(c, LR_POLICY), {})[str(c.get(LR_POLICY))] = c
    width = tie_width(test_size)
    lower, higher, mixed = [], [], []
    names: set[str] = set()
    for pol in fams.values():
        const = pol.get("constant")
        for name in AWARE:
            aware = pol.get(name)
            if const is None or aware is None or not (const.all_learned() and aware.all_learned()):
                continue
            sigma = const.values("staleness_mean")
            if not sigma or max(sigma) <= 0:
                continue
            by_aware, by_const = aware.by_seed(), const.by_seed()
            seeds = [s for s in by_aware if s in by_const]
            if len(seeds) < 2:
                continue
            diffs = [by_aware[s]["final_test_error"] - by_const[s]["final_test_error"] for s in seeds]
            names.add(name)
            case = (const, diffs)
            if all(d < -width - 1e-12 for d in diffs):
                lower.append(case)
            elif all(d > width + 1e-12 for d in diffs):
                higher.append(case)
            else:
                mixed.append(case)
    total = len(lower) + len(higher) + len(mixed)
    if not total:
        return None
    cases = lower + higher + mixed
    n = max(len(d) for _, d in cases)
    keys = [k for k in varying_keys([c.head for c, _ in cases]) if k != LR_POLICY]
    protocols = listing(sorted({label(c.head, [], omit=("learners", "minibatch")) for c, _ in cases}))

    def largest(group: list[tuple[Config, list[float]]]) -> str:
        const, diffs = max(group, key=lambda c: abs(math.fsum(c[1])))
        return (f"largest: {label(const.head, keys)}, {_points(min(diffs))} to {_points(max(diffs))} points"
                if len(diffs) > 1 else f"largest: {label(const.head, keys)}, {_points(diffs[0])} points")

    said = []
    if lower:
        said.append(f"lowers the final error in every seed in {len(lower)} ({largest(lower)})")
    if higher:
        said.append(f"raises it in every seed in {len(higher)} ({largest(higher)})")
    if mixed:
        said.append(f"has no effect that survives the seed in {_which(said, len(mixed), total)} (the "
                    f"difference changes sign between seeds, or is {TIE_SAMPLES} test samples or fewer in some seed; "
                    f"{largest(mixed)})")
    policy = " / ".join(sorted(names))
    return (f"Where both learning rates learn in every one of {n} seeds on stale gradients ({total} configuration"
            f"{'s' * (total != 1)} of {protocols}), the staleness-aware rate ({policy}) " + "; ".join(said) + ".")


def _which(said: list[str], k: int, total: int) -> str:
    return f"all {k}" if k == total and k > 1 else f"the other {k}" if said else str(k)


def _points(d: float) -> str:
    return f"{100 * d:+.1f}".replace("-", "−")


def eta_squared(groups: Sequence[Sequence[float]]) -> float:
    """η² of a one-way grouping: the between-group sum of squares over the total (nan when the
    values do not vary)."""
    values = [v for g in groups for v in g]
    grand = math.fsum(values) / len(values)
    total = math.fsum((v - grand) ** 2 for v in values)
    between = math.fsum(len(g) * (math.fsum(g) / len(g) - grand) ** 2 for g in groups)
    return between / total if total > 0 else math.nan


def _shape(cs: list[Config], seed: Any, width: float) -> tuple[bool, bool]:
    """(U, rises) of one seed's mean final error by μλ: a U is an interior μλ lower than both
    ends by more than ``width``; it rises when the largest μλ's exceeds the smallest's by more."""
    by_total: dict[float, list[float]] = {}
    for c in cs:
        r = c.by_seed().get(seed)
        if r is not None and is_number(r.get("final_test_error")):
            by_total.setdefault(c.get("learners") * c.get("minibatch"), []).append(r["final_test_error"])
    means = [math.fsum(v) / len(v) for _, v in sorted(by_total.items())]
    if len(means) < 2:
        return False, False
    low = min(range(len(means)), key=means.__getitem__)
    u = 0 < low < len(means) - 1 and means[0] - means[low] > width and means[-1] - means[low] > width
    return u, means[-1] > means[0] + width


def minibatch_finding(rows: Iterable[Row], test_size: int | None = None) -> str | None:
    """"Error tracks the total minibatch μλ", tested where it means something: the softsync and
    async configurations (hardsync(λ, μ) is SGD with minibatch λμ, so there it holds by
    construction), one series per protocol, n and swept keys. In each seed, η² of the final
    error grouped by μλ over the diagonals that hold at least two configurations (the share of
    its variance that μλ alone explains; by chance about (k − 1)/(m − 1) for m configurations on
    k diagonals) must be at least ``MIN_ETA_SQUARED``, and the mean error by μλ must rise from
    the smallest μλ to the largest in every seed, and show a U in no seed (an interior μλ lower
    than both ends by more than the noise of the test set): a finding that fails in one
    replicate is not printed. The sentence gives the largest gap within one μλ diagonal in any
    seed (what μλ does not explain) and, where the lowest mean lies at an interior μλ, says so."""
    configs = [c for c in configs_of(rows) if c.get("protocol") in STALE_PROTOCOLS
               and is_number(c.get("learners")) and is_number(c.get("minibatch"))]
    series: dict[tuple, list[Config]] = {}
    for c in configs:
        series.setdefault(_without(c, "learners", "minibatch"), []).append(c)
    width = tie_width(test_size)
    held = []
    for cs in series.values():
        seeds = sorted({s for c in cs for s in c.by_seed()}, key=str)
        etas: list[tuple[float, int, int]] = []
        gaps: list[tuple[float, float, Any]] = []  # (max − min within a diagonal, its μλ, the seed)
        for s in seeds:
            diag: dict[float, list[float]] = {}
            for c in cs:
                r = c.by_seed().get(s)
                if r is not None and is_number(r.get("final_test_error")) and r.get("diverged") is not True:
                    diag.setdefault(c.get("learners") * c.get("minibatch"), []).append(r["final_test_error"])
            groups = [g for g in diag.values() if len(g) >= 2]
            if len(groups) < 2:
                etas = []
                break
            etas.append((eta_squared(groups), sum(map(len, groups)), len(groups)))
            gaps += [(max(g) - min(g), t, s) for t, g in diag.items() if len(g) >= 2]
        if not etas or not all(e >= MIN_ETA_SQUARED for e, _, _ in etas):
            continue
        shapes = [_shape(cs, s, width) for s in seeds]
        if any(u for u, _ in shapes) or not all(rises for _, rises in shapes):
            continue  # a U in some seed, or no rise in some seed: "tracks μλ" would not hold in every one
        by_total: dict[float, list[float]] = {}
        for c in cs:
            by_total.setdefault(c.get("learners") * c.get("minibatch"), []).extend(c.values("final_test_error"))
        means = [(t, math.fsum(v) / len(v)) for t, v in sorted(by_total.items()) if v]
        held.append((cs, etas, means, max(gaps, key=lambda g: g[0])))
    if not held:
        return None
    keys = varying_keys([c.head for cs, *_ in held for c in cs])
    parts = []
    for cs, etas, means, (gap, at, seed) in held:
        name = label(cs[0].head, [k for k in keys], omit=("learners", "minibatch"))
        _, m, k = etas[0]
        low = min(means, key=lambda tm: tm[1])
        dip = f", lowest {pct(low[1])} at {low[0]:g}" if low not in (means[0], means[-1]) else ""
        parts.append(f"{name} (η² = {span([e for e, _, _ in etas], lambda v: f'{v:.2f}')}{over(len(etas))}, "
                     f"{m} configurations on {k} μλ diagonals, chance ≈ {(k - 1) / (m - 1):.2f}; mean final error "
                     f"{pct(means[0][1])} at μλ = {means[0][0]:g}{dip}, {pct(means[-1][1])} at {means[-1][0]:g}; "
                     f"within a diagonal up to {100 * gap:.1f} points apart, μλ = {at:g}"
                     + (f" in seed {seed}" if len(etas) > 1 else "") + ")")
    return ("Error tracks the total minibatch μλ (Rudra's rule: keep μλ about constant) under "
            + listing(parts) + ": the error rises with μλ and μλ alone explains most of its variance, in every seed.")


def _fell_back(r: Row) -> bool:
    """A run that learned and then lost it: its best evaluation at most half its final error."""
    best, final = r.get("best_test_error"), r.get("final_test_error")
    return is_number(best) and is_number(final) and math.isfinite(final) and best <= final / 2


def not_learned_finding(rows: Iterable[Row]) -> str | None:
    """How many runs (with replicates: configurations, in all or some of their seeds) did not
    learn or diverged, so that no one reads their times as results: the two counted apart (a
    run that diverged is counted as that, whatever its final error), and of those that ended no
    better, the ones whose best evaluation was at most half their final error (they learned first)."""
    rows = list(rows)
    bad = [r for r in rows if r.get("did_not_learn") is True or r.get("diverged") is True]
    if not bad:
        return None
    div = sum(r.get("diverged") is True for r in bad)
    ended = [r for r in bad if r.get("diverged") is not True]
    parts = []
    if ended:
        fell = [r["best_test_error"] for r in ended if _fell_back(r)]
        parts.append(f"{len(ended)} ended no better than chance or than their first evaluation" + (
            f", {len(fell)} of them after reaching {span(fell)} error earlier" if fell else ""))
    if div:
        parts.append(f"{div} diverged")
    what = " and ".join(parts)
    configs = configs_of(rows)
    if all(c.n == 1 for c in configs):
        return f"{len(bad)} of {len(rows)} runs did not learn: {what}; their times are not results."
    failing = [c for c in configs if c.none_learned()]
    some = [c for c in configs if not c.none_learned() and not c.all_learned()]
    n = max(c.n for c in configs)
    if failing:
        head = f"{len(failing)} of {len(configs)} configurations did not learn in any of their {n} seeds" + (
            f", {len(some)} more in some of them" if some else "")
    else:
        head = f"{len(some)} of {len(configs)} configurations did not learn in some of their {n} seeds"
    return head + f" ({len(bad)} of {len(rows)} runs: {what}); their times are not results."


BANDWIDTH = "cluster.network.bandwidth_Bps"
METHOD_KEYS = ("protocol", "protocol.compression", "protocol.local_steps", "protocol.outer_lr",
               "protocol.outer_momentum", "protocol.fragments", "protocol.powersgd_rank")
METHOD_NAMES = {"allreduce": "AllReduce-SGD", "local_sgd": "local SGD", "diloco": "DiLoCo"}
COMPRESSION_NAMES = {"powersgd": "PowerSGD"}  # (fp16 and bf16 are their own names)


def method_name(c: Config) -> str:
    """How a configuration trains and averages: ``"DiLoCo + PowerSGD"``, ``"AllReduce-SGD"``
    (protocol, then each swept method key that is not its default)."""
    proto = str(c.get("protocol"))
    name = METHOD_NAMES.get(proto, proto)
    comp = c.get("protocol.compression")
    if comp not in (None, "", "none"):
        name += f" + {COMPRESSION_NAMES.get(str(comp), comp)}"
    for key in METHOD_KEYS[2:]:
        v = c.get(key)
        if is_value(v):
            name += f" {key.rsplit('.', 1)[1]}={format_cell(v)}"
    return name


def rate(bps: float) -> str:
    """A bandwidth in bytes/s as people say it: ``"1 MB/s (8 Mb/s)"``."""
    def si(v: float, unit: str) -> str:
        for k, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if v >= k:
                return f"{v / k:.3g} {prefix}{unit}"
        return f"{v:.3g} {unit}"
    return f"{si(bps, 'B/s')} ({si(8 * bps, 'b/s')})"


def bandwidth_finding(rows: Iterable[Row], curves: Iterable[Row] | None = None,
                      target: float | None = None) -> str | None:
    """Where a sweep compares ways of training and averaging (protocols, compressions, …) across
    the network's bandwidth: at each bandwidth (and each λ, μ), which method reaches the same
    error first in every seed — the target when some method reached it in every seed (a run that
    never does is never first), else the highest of their mean final errors — or that none does.
    Methods that did not learn in every seed are named as such and never win. Left out without two
    methods and two bandwidths of one configuration each."""
    configs = configs_of(rows)
    if not configs or any(not is_number(c.get(BANDWIDTH)) for c in configs):
        return None
    idx = curve_index(curves)
    groups: dict[tuple, list[Config]] = {}
    for c in configs:
        groups.setdefault((c.get("learners"), c.get("minibatch"), c.get(BANDWIDTH)), []).append(c)
    if len({k[2] for k in groups}) < 2 or any(len(g) < 2 for g in groups.values()):
        return None
    for g in groups.values():
        if len({method_name(c) for c in g}) != len(g):  # another swept key: not one config per method
            return None
    n = max(c.n for c in configs)
    parts: dict[tuple, list[str]] = {}
    for (lam, mu, bw), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        ok = [c for c in g if c.all_learned()]
        bad = [method_name(c) for c in g if not c.all_learned()]
        tail = f"; {listing(bad)} did not learn in every seed" if bad else ""
        if not ok:
            parts.setdefault((lam, mu), []).append(f"at {rate(bw)} no method learned in every seed")
            continue
        # the target when some method reached it in every seed (the others: never), else the
        # highest mean final error, which every method that learned reaches
        reached = target is not None and any(all(is_number(r.get("time_to_target_s")) for r in c.runs) for c in ok)
        level = target if reached and target is not None else max(c.mean("final_test_error") for c in ok)
        seeds = sorted(set.intersection(*(set(c.by_seed()) for c in ok)), key=str)
        times: dict[str, list[float]] = {}
        still: dict[str, list[float]] = {}  # per seed, the last time the method was still above the level
        for c in ok:
            ts, before = [], []
            for sd in seeds:
                curve = idx.get(str(c.by_seed()[sd].get("run_id")), [])
                t = time_to(curve, level)
                ts.append(math.inf if t is None else t)
                before.append(time_before(curve, level))
            times[method_name(c)], still[method_name(c)] = ts, before
        why = "the target" if reached else "the highest mean final error of the methods that learned"
        # first in a seed only when it got there no later than every other was measured still above
        # it: a lead shorter than another's evaluation spacing is no lead
        winners = [m for m, ts in times.items()
                   if all(t <= min(o[i] for mm, o in still.items() if mm != m) for i, t in enumerate(ts))]
        if winners and math.isfinite(max(times[winners[0]])):
            w = winners[0]
            second = min(((statistics.fmean(o), mm) for mm, o in times.items() if mm != w), default=(math.inf, ""))
            nxt = (f"{second[1]} next by its mean, {span([t for t in times[second[1]] if math.isfinite(t)], secs)}"
                   if math.isfinite(second[0]) else "no other method reaches it in every seed")
            parts.setdefault((lam, mu), []).append(
                f"at {rate(bw)} {w} ({span(times[w], secs)} to {pct(level)}, {why}; {nxt}){tail}")
        else:
            parts.setdefault((lam, mu), []).append(
                f"at {rate(bw)} no method is first to {pct(level)} ({why}) in every seed by more than the others' "
                f"evaluation spacing{tail}")
    seeds_text = f"in every one of {n} seeds" if n > 1 else "in its one seed"
    out = []
    for (lam, mu), ps in parts.items():
        out.append(f"λ = {lam}, μ = {mu}: " + "; ".join(ps))
    return (f"First to the same error, {seeds_text}, by network bandwidth — " + ". ".join(out) + ".")


def findings(rows: Iterable[Row], curves: Iterable[Row] | None = None, test_size: int | None = None,
             target: float | None = None) -> list[str]:
    """The findings the rows support, most important first (see the module's rules)."""
    rows = list(rows)
    curves = list(curves or ())
    if target is None:
        targets = {r.get("workload.target_error") for r in rows}
        target = targets.pop() if len(targets) == 1 and is_number(next(iter(targets), None)) else None
    multi = any(c.n > 1 for c in configs_of(rows))
    out = [staleness_finding(rows, curves, test_size, target),
           policy_finding(rows, test_size) if multi else None,
           minibatch_finding(rows, test_size), bandwidth_finding(rows, curves, target),
           not_learned_finding(rows)]
    return [s for s in out if s]


# -- the answers: best configurations ------------------------------------------------------------
def configuration_rows(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One row per configuration to rank: its first run's row with ``final_test_error``,
    ``best_test_error`` and ``sim_time_s`` replaced by their means over the replicates,
    ``time_to_target_s`` by its mean when every replicate reached the target (else None),
    ``diverged`` / ``did_not_learn`` True when any replicate did, ``replicates`` and the
    :func:`.metrics.configuration_row` columns (``…_min``, ``…_max``, ``…_ci_low``, …) beside; a
    configuration of one run is that run's row."""
    out = []
    for c in configs_of(rows):
        stats = configuration_row(c.runs)
        if c.n == 1:
            out.append({**stats, **c.head, "replicates": 1, "_runs": c.runs})
            continue
        row = {**stats, **c.head, "replicates": c.n, "_runs": c.runs}
        for col in ("final_test_error", "best_test_error", "sim_time_s"):
            row[col] = stats[f"{col}_mean"]
        ttt = stats["time_to_target_s_mean"]
        row["time_to_target_s"] = ttt if stats["time_to_target_reached"] == c.n else None
        row["diverged"] = any(r.get("diverged") is True for r in c.runs)
        row["did_not_learn"] = any(r.get("did_not_learn") is True for r in c.runs)
        out.append(row)
    return out


def best(rows: Iterable[Row], col: str, keep: Callable[[Row], bool] = learned) -> Row | None:
    """The row with the lowest ``col`` among ``keep`` rows; ties: shorter simulated time,
    then label order."""
    ok = [r for r in rows if is_number(r.get(col)) and keep(r)]
    if not ok:
        return None
    return min(ok, key=lambda r: (r[col], r["sim_time_s"] if is_number(r.get("sim_time_s")) else float("inf"),
                                  label(r)))


def tied(rows: Iterable[Row], winner: Row, col: str = "final_test_error",
         test_size: int | None = None) -> list[Row]:
    """The other rows that learned and that ``col`` does not tell apart from the ``winner``
    (:func:`.metrics.within_intervals`: within :func:`tie_width`, or, for configurations with
    replicates, each mean within the other's 95 % interval), the winner excluded, ordered as
    :func:`best` orders them."""
    width = tie_width(test_size)
    out = [r for r in rows if r is not winner and r.get("run_id", id(r)) != winner.get("run_id") and learned(r)
           and is_number(r.get(col))
           and (r[col] - winner[col] <= width + 1e-12 or within_intervals(r, winner, col, width))]
    return sorted(out, key=lambda r: (r[col], r["sim_time_s"] if is_number(r.get("sim_time_s")) else float("inf"),
                                      label(r)))


def _first_elsewhere(winner: Row, rows: Sequence[Row]) -> str:
    """``"; not first in every seed: X reaches it first in k of n"`` when another configuration
    reaches the target before the one of lowest mean time in some seed they share (a seed that
    did not reach it counts as slower); the one first in most seeds (then lowest mean) is named."""
    def times(r: Row) -> dict[Any, float]:
        return {x.get("seed"): x["time_to_target_s"] if is_number(x.get("time_to_target_s")) else math.inf
                for x in r.get("_runs") or []}

    mine = times(winner)
    if len(mine) < 2:
        return ""
    keys = varying_keys(rows)
    rivals = []
    for r in rows:
        if r is winner or not learned(r):
            continue
        theirs = times(r)
        shared = [k for k in mine if k in theirs]
        wins = sum(theirs[k] < mine[k] for k in shared)
        if wins:
            mean = r["time_to_target_s"] if is_number(r.get("time_to_target_s")) else math.inf
            rivals.append((-wins, mean, label(r, keys), len(shared)))
    if not rivals:
        return ""
    wins, _, name, n = min(rivals)
    return f"; not first in every seed: {name} reaches it first in {-wins} of {n}"


def _spread_text(r: Row, col: str, fmt: Callable[[float], str]) -> str:
    """``" (2.2–4.7 % over 3 seeds)"`` for a configuration with replicates; nothing for one run."""
    runs = r.get("_runs") or []
    values = [x[col] for x in runs if is_number(x.get(col))]
    return f" ({span(values, fmt)}{over(len(values))})" if len(values) > 1 else ""


def answers(rows: Iterable[Row]) -> list[tuple[str, Row | None, str]]:
    """(question, row, value text) for: lowest final error, fastest to the target, shortest run;
    asked of configurations (:func:`configuration_rows`: the mean over replicates, with their
    range; a configuration of one run is that run), only those that learned in every seed
    compete, ties broken as :func:`best` says. When the runs carry a time to target (the column
    exists), the shortest run is the shortest of those that reached the target in every seed, one
    that did not is no answer; none did: the row is ``None`` and the text says so."""
    rows = configuration_rows(rows)
    multi = any(r.get("replicates", 1) > 1 for r in rows)
    mean = "mean " if multi else ""
    unit = "configurations" if multi else "runs"
    out: list[tuple[str, Row | None, str]] = []
    if r := best(rows, "final_test_error"):
        out.append((f"Lowest {mean}final test error", r, pct(r["final_test_error"])
                    + _spread_text(r, "final_test_error", pct)
                    + (f" after {secs(r['sim_time_s'])}" if is_number(r.get("sim_time_s")) else "")))
    if r := best(rows, "time_to_target_s"):
        out.append(("Fastest to the target error" + (" (mean over seeds)" if multi else ""), r,
                    secs(r["time_to_target_s"]) + _spread_text(r, "time_to_target_s", secs)
                    + _first_elsewhere(r, rows)))
    usable = [r for r in rows if r.get("diverged") is not True and r.get("did_not_learn") is not True]
    if any("time_to_target_s" in r for r in rows):
        question = ("Shortest simulated run (its whole length, not a time to the same error) that reached the "
                    "target error" + (" in every seed" if multi else ""))
        if r := best(usable, "sim_time_s", keep=lambda r: is_number(r.get("time_to_target_s"))):
            out.append((question, r, secs(r["sim_time_s"]) + _spread_text(r, "sim_time_s", secs) + (
                f" ({pct(r['final_test_error'])} {mean}final error)" if is_number(r.get("final_test_error")) else "")))
        elif any(is_number(r.get("sim_time_s")) for r in rows):
            out.append((question, None, f"none of the {len(rows)} {unit} reached the target error"))
    elif r := best(usable, "sim_time_s", keep=lambda r: True):
        out.append(("Shortest simulated run", r, secs(r["sim_time_s"])))
    return out


def ranks(values: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (Pearson's r of the ranks); nan when a side is constant."""
    rx, ry = ranks(x), ranks(y)
    n = len(x)
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


__all__ = ["findings", "answers", "best", "learned", "tied", "tie_width", "TIE_SAMPLES", "staleness_finding",
           "minibatch_finding", "policy_finding", "not_learned_finding", "eta_squared", "configuration_rows",
           "configs_of", "Config", "span", "spearman", "ranks", "same_error_times"]
