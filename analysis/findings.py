"""What a sweep found, in words: the sentences the report (and ``ddlsim run``) lead with.

Pure functions of summary rows. Each finding states numbers read from the rows and is
made only when the rows show it (both learning-rate policies present, a clear trend);
otherwise it is left out rather than guessed. Ties are broken the same way everywhere:
the lower value, then the shorter simulated time, then the label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .table import is_number, label

Row = Mapping[str, Any]
LR_POLICY = "optimizer.lr_policy"
AWARE = ("per_gradient", "mean_staleness")  # staleness-aware learning-rate policies
AWARE_TEXT = {"per_gradient": "dividing the rate by each gradient's staleness",
              "mean_staleness": "dividing the rate by the mean staleness"}
MIN_RANK_CORRELATION = 0.5  # "error tracks μλ" is said only above this Spearman ρ


def pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def secs(v: float) -> str:
    return f"{v:.3g} s"


def learned(r: Row) -> bool:
    """A run that produced a usable model: it has a final error, did not diverge and learned."""
    return is_number(r.get("final_test_error")) and r.get("diverged") is not True \
        and r.get("did_not_learn") is not True


def best(rows: Iterable[Row], col: str, keep: Callable[[Row], bool] = learned) -> Row | None:
    """The row with the lowest ``col`` among ``keep`` rows; ties: shorter simulated time,
    then label order."""
    ok = [r for r in rows if is_number(r.get(col)) and keep(r)]
    if not ok:
        return None
    return min(ok, key=lambda r: (r[col], r["sim_time_s"] if is_number(r.get("sim_time_s")) else float("inf"),
                                  label(r)))


def _same_but(r: Row, key: str) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in r.items() if k != key and _is_config(k)))


def _is_config(k: str) -> bool:
    return k in ("protocol", "softsync_n", "learners", "minibatch") or ("." in k and k != "workload.seed")


def staleness_finding(rows: list[Row]) -> str | None:
    """Where a constant learning rate fails under staleness and a staleness-aware one
    repairs it: the case with the most learners (then the largest gap), compared with
    hardsync at the same λ and μ when the sweep has it."""
    by_cfg: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        if r.get(LR_POLICY) is not None:
            by_cfg.setdefault(_same_but(r, LR_POLICY), {})[str(r[LR_POLICY])] = r
    cases = []
    for pol in by_cfg.values():
        const = pol.get("constant")
        for name in AWARE:
            aware = pol.get(name)
            if const is None or aware is None or not all(
                    is_number(const.get(k)) for k in ("staleness_mean", "final_test_error", "learners", "minibatch")):
                continue
            if const["staleness_mean"] < 1 or learned(const) or not learned(aware):
                continue
            cases.append((const, aware, name))
    if not cases:
        return None
    const, aware, name = max(cases, key=lambda c: (c[0]["learners"],
                                                   c[0]["final_test_error"] - c[1]["final_test_error"]))
    where = f"λ = {const['learners']:g}, μ = {const['minibatch']:g}"
    text = (f"{label(const, keys=[], omit=('learners', 'minibatch'))} with a constant learning rate does not "
            f"learn at {where} ({pct(const['final_test_error'])} test error, ⟨σ⟩ = "
            f"{const['staleness_mean']:.3g}); {AWARE_TEXT[name]} ({name}) brings it to "
            f"{pct(aware['final_test_error'])}")
    hard = best((r for r in rows if r.get("protocol") == "hardsync" and r.get("learners") == const["learners"]
                 and r.get("minibatch") == const["minibatch"]), "final_test_error")
    if hard is not None and _positive(hard.get("sim_time_s")) and is_number(aware.get("sim_time_s")):
        saved = 1 - aware["sim_time_s"] / hard["sim_time_s"]
        text += (f" (hardsync: {pct(hard['final_test_error'])}) in "
                 + (f"{100 * saved:.0f} % less time" if saved > 0 else f"{-100 * saved:.0f} % more time")
                 + f" ({secs(aware['sim_time_s'])} against hardsync's {secs(hard['sim_time_s'])})")
    return text + "."


def _positive(v: Any) -> bool:
    return is_number(v) and v > 0


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


def minibatch_finding(rows: list[Row]) -> str | None:
    """Hardsync (no staleness, so μλ is the only difference) error against the total
    minibatch μλ, said when its rank correlation is at least ``MIN_RANK_CORRELATION`` over
    at least four distinct μλ."""
    pts = list({(r["learners"], r["minibatch"], r["final_test_error"]): r for r in rows
                if r.get("protocol") == "hardsync" and is_number(r.get("learners"))
                and is_number(r.get("minibatch")) and is_number(r.get("final_test_error"))
                and r.get("diverged") is not True}.values())  # identical replays count once
    total = [r["learners"] * r["minibatch"] for r in pts]
    if len(set(total)) < 4:
        return None
    rho = spearman(total, [r["final_test_error"] for r in pts])
    if not rho >= MIN_RANK_CORRELATION:
        return None
    cut = sorted(set(total))[len(set(total)) // 2 - 1]
    small = [r["final_test_error"] for r, t in zip(pts, total) if t <= cut]
    worst = max(pts, key=lambda r: (r["learners"] * r["minibatch"], r["final_test_error"]))
    updates = f", {worst['updates']:g} updates" if is_number(worst.get("updates")) else ""
    return (f"Error tracks the total minibatch μλ (Rudra's rule: keep μλ about constant): hardsync reaches "
            f"{pct(min(small))}–{pct(max(small))} with μλ ≤ {cut:g} but {pct(worst['final_test_error'])} "
            f"at μλ = {worst['learners'] * worst['minibatch']:g} (λ = {worst['learners']:g}, "
            f"μ = {worst['minibatch']:g}{updates}); Spearman ρ = {rho:.2f} over {len(pts)} runs.")


def not_learned_finding(rows: list[Row]) -> str | None:
    """How many runs did not learn or diverged, so that no one reads their times as results."""
    bad = [r for r in rows if r.get("did_not_learn") is True or r.get("diverged") is True]
    if not bad:
        return None
    div = sum(r.get("diverged") is True for r in bad)
    return (f"{len(bad)} of {len(rows)} runs did not learn (final error no better than chance or than "
            f"their first evaluation)" + (f", {div} of them diverged" if div else "")
            + "; their times are not results.")


def findings(rows: Iterable[Row]) -> list[str]:
    """The findings the rows support, most important first."""
    rows = list(rows)
    out = [f(rows) for f in (staleness_finding, minibatch_finding, not_learned_finding)]
    return [s for s in out if s]


TIE_SAMPLES = 2  # final errors this many test samples apart are one result: the noise of the test set


def tie_width(test_size: int | None) -> float:
    """How far apart two test errors may lie and still be tied: ``TIE_SAMPLES`` test samples
    (``TIE_SAMPLES / test_size``), or 0 (equal only) when the test set's size is unknown."""
    return TIE_SAMPLES / test_size if test_size else 0.0


def tied(rows: Iterable[Row], winner: Row, col: str = "final_test_error",
         test_size: int | None = None) -> list[Row]:
    """The other runs that learned whose ``col`` lies within :func:`tie_width` of the
    ``winner``'s (the winner excluded), ordered as :func:`best` orders them."""
    width = tie_width(test_size)
    top = winner[col]
    out = [r for r in rows if r is not winner and learned(r) and is_number(r.get(col))
           and r[col] - top <= width + 1e-12]
    return sorted(out, key=lambda r: (r[col], r["sim_time_s"] if is_number(r.get("sim_time_s")) else float("inf"),
                                      label(r)))


def answers(rows: Iterable[Row]) -> list[tuple[str, Row | None, str]]:
    """(question, row, value text) for: lowest final error, fastest to the target, shortest run;
    only runs that learned compete, ties broken as :func:`best` says. When the runs carry a
    time to target (the column exists), the shortest run is the shortest of those that reached
    the target, a run that did not is no answer; none did: the row is ``None`` and the text
    says so."""
    rows = list(rows)
    out: list[tuple[str, Row | None, str]] = []
    if r := best(rows, "final_test_error"):
        out.append(("Lowest final test error", r, pct(r["final_test_error"])
                    + (f" after {secs(r['sim_time_s'])}" if is_number(r.get("sim_time_s")) else "")))
    if r := best(rows, "time_to_target_s"):
        out.append(("Fastest to the target error", r, secs(r["time_to_target_s"])))
    usable = [r for r in rows if r.get("diverged") is not True and r.get("did_not_learn") is not True]
    if any("time_to_target_s" in r for r in rows):
        question = "Shortest simulated run that reached the target error"
        if r := best(usable, "sim_time_s", keep=lambda r: is_number(r.get("time_to_target_s"))):
            out.append((question, r, secs(r["sim_time_s"]) + (
                f" ({pct(r['final_test_error'])} final error)" if is_number(r.get("final_test_error")) else "")))
        elif any(is_number(r.get("sim_time_s")) for r in rows):
            out.append((question, None, f"none of the {len(rows)} runs reached the target error"))
    elif r := best(usable, "sim_time_s", keep=lambda r: True):
        out.append(("Shortest simulated run", r, secs(r["sim_time_s"])))
    return out


__all__ = ["findings", "answers", "best", "learned", "tied", "tie_width", "TIE_SAMPLES", "staleness_finding", "minibatch_finding",
           "not_learned_finding", "spearman", "ranks"]
