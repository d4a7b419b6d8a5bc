"""The replay backend: execute a protocol trace with real gradients on one device.

Two strategies execute the same semantics (docs/replay.md): the generic interpreter
(:class:`.replay_generic.Replayer`, ops in trace order, gradients batched by lookahead) and,
for multi-node traces, the stacked replay (:class:`.replay_stacked.StackedReplayer`,
dataflow batches over a pool of weights rows). :func:`make_replayer` picks one from
``RunOptions.stacked`` ("auto" | "on" | "off") and the trace.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from ..simulator.catalog import FILE_DATASETS
from ..simulator.trace import Trace
from .base import BackendError, BackendResult, RunOptions
from .device import resolve_device, torch_threads
from .optim import Optimizer, mean_staleness
from .replay_generic import Replayer
from .replay_local import LocalReplayer, needs_local_replay
from .replay_multi import replay_many
from .replay_plan import BATCH_CAP, capped, check_header
from .replay_prefix import prefix, until_of
from .replay_stacked import StackedReplayer, gradient_rounds
from .workloads import Data, build_model, load_data

STACKED_MODES = ("auto", "on", "off")
# auto: stacked when it saves at least this many gradient calls per gradient. Measured (CPU,
# digits MLP, docs/replay.md): a saved vmap call is worth ≈ 0.7 ms, the stacked path's extra
# bookkeeping costs ≈ 15 µs per gradient, so break-even is ≈ 1/45; 1/20 keeps a 2× margin.
STACKED_MIN_SAVED = 1 / 20


def make_replayer(trace: Trace, model: nn.Module, data: Data, opt: Optimizer, *, batched: bool = True,
                  stacked: str = "auto", **kw: Any) -> Replayer | StackedReplayer | LocalReplayer:
    """The interpreter for ``trace``: the generic :class:`Replayer` or, for a multi-node trace,
    the stacked one (docs/replay.md, "Multi-node traces").

    ``stacked``: "off" (generic), "on" (stacked whenever it applies: several nodes, a batchable
    model, ``batched``) or "auto": stacked when it applies and makes at least
    ``STACKED_MIN_SAVED`` × (gradients) fewer vmap calls than the generic path (predicted by
    :func:`.replay_stacked.gradient_rounds`) — the measured condition for it to be faster. An
    all-reduce trace stays generic under "auto": its plan fuses each round into one call
    (:func:`.replay_plan.equal_states`), as few calls as the stacked replay makes.
    """
    if stacked not in STACKED_MODES:
        raise BackendError(f"stacked replay mode {stacked!r}: expected one of {', '.join(STACKED_MODES)}")
    if needs_local_replay(trace):  # outer ops, fragment mixes, compressed averaging (schema 2)
        return LocalReplayer(trace, model, data, opt, batched=batched)
    nodes = int(trace.header.get("nodes", 1))
    if stacked == "off" or nodes <= 1 or not batched:
        return Replayer(trace, model, data, opt, batched=batched, **kw)
    if stacked == "on":
        return StackedReplayer(trace, model, data, opt, batched=batched, **kw)
    rep = Replayer(trace, model, data, opt, batched=batched, **kw)
    if not rep.batched or rep.rows == 1:  # row batches do not pay for this model here (batch_rows)
        return rep
    cap = capped(rep.flat.size, kw.get("batch_cap", BATCH_CAP))
    need = STACKED_MIN_SAVED * len(rep.plan.grads)
    best = -(-len(rep.plan.grads) // min(cap, nodes))  # one call per iteration
    if rep.plan.calls - best < need or rep.plan.calls - gradient_rounds(trace, rep.plan, cap) < need:
        return rep
    return StackedReplayer(trace, model, data, opt, batched=batched, **kw)


def chance_error(labels: Any) -> float:
    """The test error of the best constant guess: 1 − (share of the most frequent label)."""
    counts = labels.bincount()
    return 1.0 - float(counts.max()) / max(1, int(counts.sum()))


def did_not_learn(errors: list[float], chance: float, n_test: int) -> bool:
    """The run did not learn: its final test error is no better than chance (not below the
    chance error by two standard errors of a test set of ``n_test``), or no better than its
    first evaluation while that was still above half the chance error (it got stuck or got
    worse before training took hold). A non-finite final error (diverged) did not learn."""
    if not errors:
        return False
    final = errors[-1]
    if not math.isfinite(final):
        return True
    margin = 2.0 * math.sqrt(chance * (1.0 - chance) / max(1, n_test))
    return final >= chance - margin or (errors[0] >= chance / 2 and final >= errors[0])


FINAL_EVALS = 3  # workload.final_evals' default


def final_error(curves: list[dict[str, Any]], final_evals: int = FINAL_EVALS) -> float:
    """The run's final test error: the mean of its last ``final_evals`` evaluations, never the
    evaluation before training (epoch 0, no update) unless it is the only one; fewer when the
    run has fewer. NaN without evaluations, and when one of those it averages is not finite."""
    errors = [float(r["test_error"]) for r in curves]
    if not errors:
        return math.nan
    first = curves[0]
    untrained = first.get("epoch") == 0 or first.get("updates") == 0
    window = (errors[1:] if untrained and len(errors) > 1 else errors)[-max(1, int(final_evals)):]
    return math.fsum(window) / len(window)


def summarize(curves: list[dict[str, Any]], target_error: float, diverged: bool,
              diverged_at_update: int | None, chance: float | None = None, n_test: int = 0,
              final_evals: int = FINAL_EVALS) -> dict[str, Any]:
    """The summary keys of :class:`BackendResult` from the measured curves: ``final_test_error``
    by :func:`final_error` (the mean of the last ``final_evals`` evaluations, so that one lucky
    evaluation is not the answer), ``best_test_error`` the lowest evaluation, ``time_to_target_s``
    the first evaluation at or below ``target_error``; ``did_not_learn`` (judged on that final
    error) only when the chance error of the test set is given."""
    errors = [r["test_error"] for r in curves]
    hit = next((r["sim_time_s"] for r in curves if r["test_error"] <= target_error), None)
    final = final_error(curves, final_evals)
    out = {
        "final_test_error": final,
        "best_test_error": min(errors) if errors else math.nan,
        "time_to_target_s": hit,
        "diverged": bool(diverged),
        "diverged_at_update": diverged_at_update if diverged else None,
    }
    if chance is not None:
        out["did_not_learn"] = bool(diverged) or did_not_learn(errors[:-1] + [final] if errors else errors, chance,
                                                             n_test)
    return out


def check_samples(trace: Trace, point: dict[str, Any], data: Data) -> None:
    """Refuse a trace whose epoch holds more samples than the files found in the data
    directory hold (it would wrap around them silently); the embedded sets may wrap."""
    spe = trace.header.get("samples_per_epoch")
    found = len(data.train_y)
    if point["workload"]["dataset"] in FILE_DATASETS and isinstance(spe, int) and spe > found:
        raise BackendError(f"the trace's samples_per_epoch = {spe:,} is more than the {found:,} training samples "
                           f"of {point['workload']['dataset']} found: pass the --data-dir that holds them all, or "
                           "simulate again with these files")


class ReplayBackend:
    """Backend "replay": executes a simulated (or live) trace on one device."""

    name = "replay"

    def run(self, trace: Trace, point: dict[str, Any], options: RunOptions | None = None) -> BackendResult:
        """Replay ``trace`` for scenario ``point``; see :class:`BackendResult` for the keys."""
        return self.run_many([(trace, point, options or RunOptions())])[0]

    def run_many(self, jobs: list[tuple[Trace, dict[str, Any], RunOptions]]) -> list[BackendResult]:
        """Replay each ``(trace, point, options)`` of ``jobs``; their results in order, each the
        one :meth:`run` gives it alone (:func:`.replay_multi.replay_many` computes the gradient
        requests of replays of one model in shared calls, which changes no replay's numbers).
        The jobs share the first one's device and thread count."""
        if not jobs:
            return []
        for trace, _, _ in jobs:
            check_header(trace)  # before any data is loaded: the header's ⟨σ⟩ is read below
        first = jobs[0][2]
        device = resolve_device(first.device)
        with torch_threads(first.threads):
            reps, datas = [], []
            for trace, point, options in jobs:
                rep, data = self._replayer(trace, point, options, device)
                reps.append(rep)
                datas.append(data)
            all_curves = replay_many(reps) if len(reps) > 1 else [reps[0].run()]
        out = []
        for (_, point, _), rep, data, curves in zip(jobs, reps, datas, all_curves):
            summary = summarize(curves, point["workload"]["target_error"], rep.diverged, rep.diverged_at_update,
                                chance_error(data.test_y), len(data.test_y),
                                int(point["workload"].get("final_evals", FINAL_EVALS)))
            out.append(BackendResult(curves=curves, summary=summary, trace=None))
        return out

    @staticmethod
    def _replayer(trace: Trace, point: dict[str, Any], options: RunOptions, device: Any
                  ) -> tuple[Replayer | StackedReplayer | LocalReplayer, Data]:
        """The interpreter of ``trace`` for ``point`` (not yet run) and the data it reads."""
        data = load_data(point, options.data_dir, options.download, device=device)
        check_samples(trace, point, data)
        model = build_model(point).to(device)
        # a measured (live) trace carries the ⟨σ⟩ its run used; else the trace's own mean
        sigma = trace.header.get("mean_staleness", mean_staleness(trace.inputs["staleness"]))
        opt = Optimizer(point["optimizer"], float(sigma))
        rep = make_replayer(trace, model, data, opt, batched=options.batched, stacked=options.stacked)
        until = until_of(point)
        if until is not None:  # a rung of successive halving: the whole trace's path on its prefix
            rep = make_replayer(prefix(trace, until), model, data, opt, batched=options.batched,
                                stacked="on" if isinstance(rep, StackedReplayer) else "off")
        if options.progress is not None:  # after each evaluation: the epoch reached
            tell, epochs = options.progress, float(point["workload"]["epochs"])
            rep.progress = lambda epoch: tell("replay", round(epoch, 2), epochs, "epochs")
        return rep, data
