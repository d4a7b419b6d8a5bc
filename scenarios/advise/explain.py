"""Why one configuration beats another, in plain words (``ddlsim advise``'s explanation)."""

from __future__ import annotations

import math

from ...analysis.metrics import spread, within_intervals
from ...simulator.catalog import dataset_info
from .model import SAME, Advice, Candidate, is_number


# -- words -------------------------------------------------------------------------------------
def secs(t: float | None) -> str:
    return "—" if t is None else f"{t:.3g} s"


def pct(e: float | None) -> str:
    return "—" if e is None else f"{100 * e:.1f} %"


def times(r: float) -> str:
    return f"{r:.2g}×" if r < 10 else f"{r:.0f}×"


def pace_cause(slow: Candidate, fast: Candidate) -> str:
    """Why ``slow`` needs more simulated time per epoch than ``fast``."""
    if slow.protocol == "hardsync" and fast.protocol != "hardsync":
        return f"its barrier makes every update wait for the slowest of its {slow.learners} learners"
    if slow.protocol == "ssp" and fast.protocol not in ("ssp", "hardsync"):
        return "its staleness bound makes fast learners wait for the slowest"
    if slow.learners < fast.learners:
        return f"it has {slow.learners} learner{'s' * (slow.learners != 1)} against {fast.learners}"
    util = slow.row.get("server_utilization")
    if is_number(util) and util > 0.8 and util > (fast.row.get("server_utilization") or 0):
        return f"its parameter server is busy {100 * util:.0f} % of the time, so gradients queue"
    if slow.minibatch < fast.minibatch:
        return (f"with μ = {slow.minibatch} against {fast.minibatch} it pays the fixed cost of a minibatch "
                f"and of a gradient message {times(fast.minibatch / slow.minibatch)} as often")
    gs, gf = slow.row.get("gradients_per_s"), fast.row.get("gradients_per_s")
    if is_number(gs) and is_number(gf):
        return f"it computes {gs:.3g} gradients per simulated second against {gf:.3g}"
    return "the simulation predicts it slower"


def stale_constant(worse: Candidate, better: Candidate) -> bool:
    """``worse``'s gradients are staler (⟨σ⟩ higher by more than 0.5, above 1) and its rate is
    constant, where ``better`` divides its rate by the staleness or has fresher gradients."""
    return (worse.sigma > better.sigma + 0.5 and worse.sigma > 1 and worse.effective_policy() == "constant")


def learning_cause(worse: Candidate, better: Candidate) -> str:
    """Why ``worse`` learns less from the same data than ``better`` (the replay measured that it
    does; these are the differences the simulation shows)."""
    if worse.diverged and not better.diverged:
        return "it diverged"
    if stale_constant(worse, better):
        return (f"its gradients are on average ⟨σ⟩ = {worse.sigma:.3g} updates stale (against "
                f"{better.sigma:.3g}) and its learning rate is constant, not divided by the staleness")
    if worse.samples_per_update > 1.5 * better.samples_per_update:
        return (f"each of its updates averages {worse.samples_per_update:.0f} samples against "
                f"{better.samples_per_update:.0f}, so it makes {worse.updates_per_epoch:.3g} updates per "
                f"epoch against {better.updates_per_epoch:.3g}")
    if worse.sigma > better.sigma + 0.5:
        return f"its gradients are staler (⟨σ⟩ = {worse.sigma:.3g} against {better.sigma:.3g})"
    if worse.effective_policy() != better.effective_policy():
        return (f"the replay measured that the {worse.policy} learning rate learns less here than "
                f"{better.policy}")
    return "the replay measured that it learns less from the same data"


def explain(a: Candidate, b: Candidate | None, budget_s: float | None,
            target_error: float | None) -> str:
    """One paragraph: why ``a`` (recommended) beats ``b`` (runner-up)."""
    if b is None:
        return "it is the only configuration replayed."
    r = b.sec_per_epoch / a.sec_per_epoch
    if budget_s is not None:
        ea, eb = a.epochs_by(budget_s), b.epochs_by(budget_s)
        if b.diverged and not a.diverged:
            return f"the runner-up diverged; {a.label} did not."
        if r >= SAME:
            text = (f"the runner-up is {times(r)} slower per epoch ({secs(b.sec_per_epoch)} against "
                    f"{secs(a.sec_per_epoch)}): {pace_cause(b, a)}; by {secs(budget_s)} it has seen "
                    f"{eb:.3g} epochs against {ea:.3g}")
            if stale_constant(b, a):
                text += f"; also, {learning_cause(b, a)}"
            return text + "."
        if r <= 1 / SAME:
            return (f"{a.label} is {times(1 / r)} slower per epoch ({pace_cause(a, b)}) and sees "
                    f"{ea:.3g} epochs by the budget against {eb:.3g}, but it learns more from each: "
                    f"in the runner-up, {learning_cause(b, a)}.")
        return (f"both get through about the same data by {secs(budget_s)} ({ea:.3g} and {eb:.3g} "
                f"epochs); the runner-up learns less from it: {learning_cause(b, a)}.")
    # target
    if b.at_s is None:
        return (f"no other replayed configuration reaches {pct(target_error)}: the runner-up's best is "
                f"{pct(b.error)} ({learning_cause(b, a)}).")
    ea, eb = a.at_epoch or 0.0, b.at_epoch or 0.0
    q = eb / ea if ea > 0 else math.inf
    if r >= SAME and q < 1 / SAME:
        return (f"the runner-up needs fewer epochs ({eb:.3g} against {ea:.3g}) but each is {times(r)} slower "
                f"({pace_cause(b, a)}): {eb:.3g} × {secs(b.sec_per_epoch)} ≈ {secs(b.at_s)} against "
                f"{ea:.3g} × {secs(a.sec_per_epoch)} ≈ {secs(a.at_s)}.")
    if r >= SAME:
        text = f"the runner-up is {times(r)} slower per epoch: {pace_cause(b, a)}"
        if q >= SAME:
            text += f"; it also needs {eb:.3g} epochs against {ea:.3g}: {learning_cause(b, a)}"
        return text + "."
    if r <= 1 / SAME:
        return (f"{a.label} is {times(1 / r)} slower per epoch ({pace_cause(a, b)}) but reaches the target "
                f"after {ea:.3g} epochs against {eb:.3g}: in the runner-up, {learning_cause(b, a)}.")
    return (f"both run at about the same pace ({secs(a.sec_per_epoch)} and {secs(b.sec_per_epoch)} per epoch); "
            f"the runner-up needs {eb:.3g} epochs against {ea:.3g}: {learning_cause(b, a)}.")


def margin(a: Candidate, b: Candidate | None, adv: Advice) -> str:
    """Warnings that the recommendation and the runner-up are not told apart: their errors
    differ by at most two test samples, or, over their replicates, each one's mean lies within
    the other's 95 % interval (errors at the budget; times to the target when both reach it)."""
    if b is None or a.error is None or b.error is None:
        return ""
    return _sample_margin(a, b, adv) + _interval_margin(a, b, adv)


def _measures(c: Candidate, adv: Advice) -> list[float]:
    """What the goal measures of each replicate of ``c``: its error at the budget, or its time
    to the target (only when every replicate reached it)."""
    if adv.mode == "budget":
        return [r.error_at(r.horizon) for r in c.reps if r.horizon is not None]
    hits = [r.hit(adv.target_error) for r in c.reps] if adv.target_error is not None else []
    return [h["sim_time_s"] for h in hits if h is not None] if hits and all(hits) else []


def _interval_margin(a: Candidate, b: Candidate, adv: Advice) -> str:
    ma, mb = _measures(a, adv), _measures(b, adv)
    if len(ma) < 2 or len(mb) < 2:
        return ""
    col = "error" if adv.mode == "budget" else "time to target"
    sa, sb = spread(ma), spread(mb)
    rows = [{f"x_{k}": v for k, v in sp.items()} for sp in (sa, sb)]
    if not within_intervals(rows[0], rows[1], "x"):
        return ""
    return (f" Over their {len(ma)} and {len(mb)} seeds each one's mean {col} lies within the other's 95 % "
            "interval: the replicates do not tell them apart.")


def _sample_margin(a: Candidate, b: Candidate, adv: Advice) -> str:
    """A warning when the two errors differ by at most two test samples."""
    if adv.mode == "target" and b.at_s is not None:
        return ""
    if a.error is None or b.error is None:
        return ""
    wl = a.point["workload"]
    try:
        size = dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"]).test_size
    except KeyError:
        return ""
    k = round(abs(b.error - a.error) * size)
    if k > 2:
        return ""
    return (f" The margin is narrow: {k} test sample{'s' * (k != 1)} of {size}, so the two are about "
            "equally good; prefer either.")
