"""``ddlsim advise``'s output: the text it prints and ``advice.csv``."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from .explain import explain, margin, pct, secs
from .model import Advice, Candidate


def _goal_words(adv: Advice) -> str:
    if adv.budget_s is not None:
        return f"a budget of {secs(adv.budget_s)} of simulated time"
    return f"a target of {pct(adv.target_error)} test error"


TOP = 10  # rows of the table `ddlsim advise` prints unless --top says otherwise


def _rung(adv: Advice, c: Any) -> str:
    """The rung a configuration was last replayed to, as ``k/K``."""
    return f"{c.rung + 1}/{len(adv.fractions)}" if c.rung is not None and adv.fractions else ""


def _table(adv: Advice, top: int | None = None) -> list[str]:
    """The table of every configuration: those replayed to their horizon first, best measured
    first, then those stopped at a rung (the furthest first, by their rank there), pruned and
    failed ones last; with ``top``, only its first ``top`` rows and a line saying how many are
    hidden and where the whole table is."""
    budget = adv.mode == "budget"
    T = adv.budget_s
    head = ["#", "configuration", f"epochs by {secs(T)}" if budget else "s/epoch", "σ mean",
            f"error at {secs(T)}" if budget else "time to target", "at epoch", "rung", "status"]

    def place(c: Any) -> tuple[int, int, int, int]:
        if c in adv.ranking:
            return (0, adv.ranking.index(c), 0, c.index)
        if c.status in ("pruned", "failed"):
            return (2 if c.status == "pruned" else 3, 0, 0, c.index)
        return (1, -(c.rung if c.rung is not None else -1), c.rank or 10**9, c.index)

    # a configuration equivalent to another comes right after it (its twin's result is its own)
    order = sorted(adv.candidates, key=lambda c: (*place(c.twin), 1, c.index)
                   if c.status == "equivalent" and c.twin is not None else (*place(c), 0, 0))
    rows = []
    for c in order:
        if c.status == "failed" and not c.evals:
            rows.append(["", c.label, "", "", "", "", "", "failed"])
            continue
        pred = f"{c.epochs_by(T):.3g}" if T is not None else f"{c.sec_per_epoch:.3g}"  # T is set in budget mode
        if c.status in ("replayed", "equivalent") and c.error is not None:
            got = pct(c.error) if budget else (secs(c.at_s) if c.at_s is not None else
                                                f"never (best {pct(c.error)})")
            ep = f"{c.at_epoch:.3g}" if c.at_epoch is not None else ""
        else:
            got, ep = "", ""
        place_no = str(adv.ranking.index(c) + 1) if c in adv.ranking else ""
        if c.status == "equivalent":
            status = f"= {c.twin.label if c.twin else '?'}"
        elif c.status == "stopped" and c.rung_scores:
            status = f"stopped ({pct(c.rung_scores[-1])} at its rung)"
        else:
            status = c.status
        rows.append([place_no, c.label, pred, f"{c.sigma:.3g}", got, ep,
                     _rung(adv, c.twin if c.status == "equivalent" and c.twin else c), status])
    hidden = len(rows) - top if top is not None and len(rows) > top else 0
    rows = rows[:len(rows) - hidden]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if hidden:
        out.append(f"… {hidden} more row{'s' * (hidden != 1)} not shown (--top {top}; --top 0 prints every row); "
                   f"all {len(rows) + hidden} are in {adv.out_dir / 'advice.csv'} and {adv.out_dir / 'advice.txt'}")
    return out


def _halving_words(adv: Advice) -> str:
    """What successive halving did: its rungs, how many configurations each held, its cost."""
    rungs = ", ".join(f"{100 * f:.3g} %" for f in adv.fractions)
    sizes = ", ".join(str(n) for n in adv.rung_sizes) or "none"
    share = (f" ({100 * adv.epochs_replayed / adv.epochs_exhaustive:.0f} % of replaying every distinct point to its "
             "horizon)" if adv.epochs_exhaustive > 0 else "")
    return (f"successive halving (η = {adv.reduction_factor:g}; rungs at {rungs} of each point's horizon) replayed "
            f"{sizes} configuration{'s' * (sizes != '1')} at its rungs, {adv.replays} replay"
            f"{'s' * (adv.replays != 1)} of {adv.epochs_replayed:.4g} epochs in all{share}, into "
            f"{adv.out_dir / 'replay'}")


def _seeds(c: Candidate, adv: Advice) -> str:
    """``"mean of N seeds, a–b; "``: the goal's figure over a configuration's seeds (its error
    at the budget, or its time to the target); nothing for one seed."""
    if len(c.reps) < 2:
        return ""
    if adv.mode == "budget":
        vals = [r.error_at(r.horizon) for r in c.reps]
        lo, hi = pct(min(vals)), pct(max(vals))
    else:
        assert adv.target_error is not None
        hits = [r.hit(adv.target_error) for r in c.reps]
        times = [h["sim_time_s"] for h in hits if h is not None]
        if len(times) < len(hits):
            return f"mean of {len(c.reps)} seeds; "
        lo, hi = secs(min(times)), secs(max(times))
    return f"mean of {len(c.reps)} seeds, {lo}–{hi}; "


def render(adv: Advice, top: int | None = None) -> str:
    """The advice as ``ddlsim advise`` prints it; ``top`` limits the table to its first
    ``top`` rows (``None``: every row, as ``advice.txt`` holds it)."""
    n = len(adv.candidates)
    lines = [f"ddlsim advise {adv.name}: {n} sweep point{'s' * (n != 1)}, {_goal_words(adv)}"]
    parts = [f"simulated all {n} into {adv.out_dir}"]
    if adv.count("failed"):
        parts.append(f"{adv.count('failed')} failed")
    if adv.count("equivalent"):
        parts.append(f"{adv.count('equivalent')} equivalent to another point (a staleness-aware "
                     "learning rate whose factors are all 1 on its trace) and not replayed twice")
    rule = ("no evaluation of a trained model within the budget" if adv.mode == "budget" else
            "first evaluation no earlier than a time to target already measured")
    parts.append(f"pruned {len(adv.pruned())} by simulated time alone ({rule})")
    if adv.fractions:
        parts.append(_halving_words(adv))
    else:
        parts.append(f"replayed {len(adv.ranking)} into {adv.out_dir / 'replay'}")
    stopped = sum(c.status in ("stopped", "not replayed") for c in adv.candidates)
    if stopped:
        parts.append(f"{stopped} stopped at a rung (not among the best 1/η there)")
    lines.append("; ".join(parts) + ".")
    lines.append("")
    lines += _table(adv, top)
    lines.append("")
    a, b = adv.recommendation, adv.runner_up
    failures = [c for c in adv.candidates if c.replay_error]
    if failures:  # say why replays failed: a missing data set or device is the usual cause
        lines.append(f"{len(failures)} replay{'s' * (len(failures) != 1)} failed: {failures[0].label}: "
                     f"{failures[0].replay_error}")
    if a is None and failures and not adv.ranking:
        lines.append("No recommendation: every replay failed (above).")
        return "\n".join(lines)
    if a is None:
        if adv.mode == "budget":
            first = min((c.first_eval_s() for c in adv.candidates if c.evals), default=math.inf)
            lines.append(f"No recommendation: no configuration evaluates a trained model within "
                         f"{secs(adv.budget_s)}; the earliest first evaluation is at {secs(first)}.")
        else:
            best = min(adv.ranking, key=lambda c: math.inf if c.error is None else c.error, default=None)
            lines.append(f"No recommendation: no replayed configuration reaches {pct(adv.target_error)}"
                         + (f"; the closest is {best.label} with {pct(best.error)}." if best else ".")
                         + " Try more epochs, a looser target, or --min-fraction 1 (every configuration "
                         "replayed whole).")
        return "\n".join(lines)
    twins = [c.label for c in adv.candidates if c.status == "equivalent" and c.twin is a]
    also = f" (the same run as {', '.join(twins)})" if twins else ""
    # configurations halving set aside after a partial replay, which a runner-up is not chosen from
    cut = any(c.status in ("stopped", "not replayed") or (c.status == "pruned" and c.rung is not None)
              for c in adv.candidates)
    runner = "Runner-up:  " if not cut else "Runner-up among those not stopped or pruned:"
    if adv.mode == "budget":
        last = ", each seed's last evaluation by the budget" if len(a.reps) > 1 else ""
        lines.append(f"Recommended: {a.label}{also}: {pct(a.error)} test error by {secs(a.at_s)} of the "
                     f"{secs(adv.budget_s)} budget ({_seeds(a, adv)}epoch {a.at_epoch:.3g}{last}).")
        if b is not None:
            lines.append(f"{runner} {b.label}: {pct(b.error)} by {secs(b.at_s)} ({_seeds(b, adv)}epoch "
                         f"{b.at_epoch:.3g}).")
    else:
        whole = "" if all(r.complete for r in a.reps) else " in its replay, which stops at the target"
        lines.append(f"Recommended: {a.label}{also}: reaches {pct(adv.target_error)} test error at "
                     f"{secs(a.at_s)} of simulated time ({_seeds(a, adv)}epoch {a.at_epoch:.3g}; best "
                     f"{pct(a.error)}{whole}).")
        if b is not None:
            reach = (f"reaches it at {secs(b.at_s)} ({_seeds(b, adv)}epoch {b.at_epoch:.3g})" if b.at_s is not None
                     else f"never reaches it (best {pct(b.error)})")
            lines.append(f"{runner} {b.label}: {reach}.")
    lines.append(f"Why: {explain(a, b, adv.budget_s, adv.target_error)}{margin(a, b, adv)}")
    if adv.mode == "target":
        never = [c for c in adv.ranking if c.at_s is None and c is not b]
        if never:
            lines.append("Never reached the target: " + "; ".join(
                f"{c.label} (best {pct(c.error)}{', diverged' if c.diverged else ''})" for c in never) + ".")
    pr = adv.pruned()
    if pr:
        lines.append("Pruned by simulated time alone: " + "; ".join(f"{c.label}: {c.note}" for c in pr[:4])
                     + (f"; and {len(pr) - 4} more" if len(pr) > 4 else "") + ".")
    lines.append(f"Curves and summary of the replayed runs: {adv.out_dir / 'replay'} "
                 f"(`ddlsim report {adv.out_dir / 'replay'}`).")
    return "\n".join(lines)


def advice_csv(adv: Advice) -> bytes:
    """One row per configuration: its status, the rung it reached (its rank, epoch and mean
    error there), its measured rank, the simulation's numbers and the goal's measurement."""
    cols = ["run_id", "label", "status", "replicates", "rung", "rung_rank", "rung_epoch", "rung_error",
            "measured_rank", "sim_time_s", "sec_per_epoch", "epochs_by_budget", "first_eval_s", "staleness_mean",
            "lr_policy", "error", "at_s", "at_epoch", "diverged", "note"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for c in adv.candidates:
        ok = bool(c.evals)
        cut = [r.evals[r.cut][1] for r in c.reps if r.cut is not None]
        w.writerow([c.run_id, c.label, c.status, len(c.reps), "" if c.rung is None else c.rung + 1, c.rank or "",
                    repr(math.fsum(cut) / len(cut)) if cut else "",
                    repr(c.rung_scores[-1]) if c.rung_scores else "",
                    adv.ranking.index(c) + 1 if c in adv.ranking else "",
                    repr(c.sim_time) if ok else "", repr(c.sec_per_epoch) if ok else "",
                    repr(c.epochs_by(adv.budget_s)) if ok and adv.budget_s is not None else "",
                    repr(c.first_eval_s()) if ok else "", repr(c.sigma), c.policy,
                    "" if c.error is None else repr(c.error), "" if c.at_s is None else repr(c.at_s),
                    "" if c.at_epoch is None else repr(c.at_epoch), c.diverged, c.note])
    return buf.getvalue().encode()
