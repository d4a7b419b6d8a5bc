"""Several replays of one model at once: their gradient batches shared across replays.

:func:`replay_many` runs replays of the same architecture on one device (the points of a
sweep, the seeds of a configuration) in lockstep: each generic replay
(:meth:`.replay_generic.Replayer.steps`) runs until it needs a batch of gradients, and the
requests of all the replays that wait are computed together, one call per kind of request —
as the stacked replay batches the learners of one trace:

* **row batches** of the same minibatch size become one call of all their rows;
* **fused batches** (an apply's gradients on one version) of the same sample count become
  one call with one row of weights per replay.

Rule kept: every replay's curves and final weights are those of its own :meth:`run`. Requests
are shared only where the model's gradients go through the hand-written kernels of
:mod:`.mlp_batched` (a Linear/ReLU stack), whose rows do not depend on the other rows of the
call, and only where row batches pay for the model on this device
(:func:`.replay_plan.batch_rows` > 1); a call holds at most as many rows as that rule allows
(counted with a cap of 64 per replay). Everything else — gradients computed alone, other
models, stacked (multi-node) replays — runs as in :meth:`run`, one replay after another.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from collections.abc import Generator, Sequence

import torch
from torch import Tensor

from .replay_generic import GradRequest, Replayer
from .replay_local import LocalReplayer
from .replay_plan import BATCH_CAP, ROWS, batch_rows
from .replay_stacked import StackedReplayer

Steps = Generator[GradRequest, tuple[Tensor, Tensor], None]


def shares_calls(rep: Replayer | StackedReplayer) -> bool:
    """Whether ``rep``'s gradient requests may be computed in calls shared with other replays:
    a generic replay whose batches go through the hand-written kernels, where row batches pay,
    and whose largest row batch leaves room in a call for another as large (else lockstep
    would only interleave the replays, each request still alone in its call)."""
    if not (isinstance(rep, Replayer) and rep.batched and rep.rows > 1
            and rep.flat.takes_rows(rep.data.train_x.dim() + 1)):
        return False
    widest = max((len(b) for b, k in zip(rep.plan.batches, rep.plan.kinds) if k == ROWS), default=0)
    return 2 * widest <= _cap(rep, 2)


def _cap(rep: Replayer, replays: int) -> int:
    """Most rows of one shared call for ``replays`` replays like ``rep`` (the batching rule)."""
    flat = rep.flat
    return batch_rows(flat.size, flat.work.element_size(), rep.device.type, flat.kernel, BATCH_CAP * replays)


def architecture(rep: Replayer) -> tuple[Any, ...]:
    """What two replays must share for one call to compute both's gradients."""
    flat = rep.flat
    return (tuple(flat.shapes), tuple(flat._mlp[1]) if flat._mlp else None, flat._mlp[0] if flat._mlp else None,
            flat.work.dtype, str(flat.work.device))


def replay_many(reps: Sequence[Replayer | StackedReplayer | LocalReplayer]) -> list[list[dict[str, Any]]]:
    """Run every replay of ``reps`` (each at most once, not yet run); return their curves in
    order. Replays that :func:`shares_calls` run in lockstep, their requests of each step
    computed in shared calls (module doc); the others run one after another."""
    curves: dict[int, list[dict[str, Any]]] = {}
    shared = {k: r for k, r in enumerate(reps) if isinstance(r, Replayer) and shares_calls(r)}
    for k, rep in enumerate(reps):
        if k not in shared:
            curves[k] = rep.run()
    gens: dict[int, Steps] = {k: r.steps() for k, r in shared.items()}
    arch = {k: architecture(r) for k, r in shared.items()}
    pending: dict[int, GradRequest] = {}
    for k, gen in gens.items():
        _advance(k, gen, None, pending)
    while pending:
        groups: dict[tuple[Any, ...], list[tuple[int, GradRequest]]] = defaultdict(list)
        for k, req in pending.items():
            groups[(arch[k], req.fused, req.xb.shape if req.fused else req.xb.shape[1:])].append((k, req))
        pending = {}
        for members in groups.values():
            for (k, _), result in zip(members, _compute(shared, members)):
                _advance(k, gens[k], result, pending)
    for k, r in shared.items():
        curves[k] = r.curves
    return [curves[k] for k in range(len(reps))]


def _advance(k: int, gen: Steps, result: tuple[Tensor, Tensor] | None, pending: dict[int, GradRequest]) -> None:
    """Run replay ``k`` to its next request (sending it ``result``), or to its end."""
    try:
        pending[k] = next(gen) if result is None else gen.send(result)
    except StopIteration:
        pass


def _rows_of(req: GradRequest) -> int:
    return 1 if req.fused else int(req.xb.shape[0])


def _compute(reps: dict[int, Replayer], members: list[tuple[int, GradRequest]]
             ) -> list[tuple[Tensor, Tensor]]:
    """The results of ``members`` (requests of one key), in order: consecutive requests share
    a call while their rows fit the batching rule's cap for all of them."""
    if len(members) == 1:
        return _shared_call(reps, members)
    cap = _cap(reps[members[0][0]], len(members))
    chunks: list[list[tuple[int, GradRequest]]] = [[]]
    rows = 0
    for member in members:
        r = _rows_of(member[1])
        if chunks[-1] and rows + r > cap:
            chunks.append([])
            rows = 0
        chunks[-1].append(member)
        rows += r
    return [result for chunk in chunks for result in _shared_call(reps, chunk)]


def _shared_call(reps: dict[int, Replayer], chunk: list[tuple[int, GradRequest]]
                 ) -> list[tuple[Tensor, Tensor]]:
    """One call for the requests of ``chunk``; each its own replay's result (module doc)."""
    if len(chunk) == 1:
        k, req = chunk[0]
        return [reps[k].compute(req)]
    flat = reps[chunk[0][0]].flat
    reqs = [req for _, req in chunk]
    if reqs[0].fused:
        weights = [r.scale for r in reqs if r.scale is not None]
        assert len(weights) == len(reqs)  # fused requests weigh their samples
        g, losses = flat.grad_weighted_batch(torch.stack([r.zs[0] for r in reqs]), torch.stack([r.xb for r in reqs]),
                                             torch.stack([r.yb for r in reqs]), torch.stack(weights))
        return [(g[i], losses[i]) for i in range(len(reqs))]
    zs: list[Tensor] = []
    for r in reqs:
        zs.extend(r.zs if len(r.zs) == len(r.xb) else r.zs * len(r.xb))
    scale = None
    if any(r.scale is not None for r in reqs):
        scale = torch.cat([r.scale if r.scale is not None else torch.ones(len(r.xb)).to(r.xb) for r in reqs])
    g, losses = flat.grad_batch(torch.stack(zs), torch.cat([r.xb for r in reqs]), torch.cat([r.yb for r in reqs]),
                                scale)
    out, o = [], 0
    for r in reqs:
        b = len(r.xb)
        out.append((g[o:o + b], losses[o:o + b]))
        o += b
    return out
