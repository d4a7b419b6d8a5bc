"""The fast engines' primitives (simulator/fast_core.py) against the rules they transcribe: the
FIFO reservation against :class:`FifoServer`, the heap against ``heapq``, the stall walk
against :class:`LearnerClock`, the cadence against :class:`EvalCadence`, the shard layout
against :class:`ShardLayout`; each compiled and as plain Python (``kernel``'s debug mode)."""

from __future__ import annotations

import heapq
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from ddlsim.simulator import fast_core
from ddlsim.simulator.collectives import transfer_time
from ddlsim.simulator.compute import DrawStream, LearnerClock
from ddlsim.simulator.dataorder import ShardLayout
from ddlsim.simulator.protocols.cadence import EvalCadence
from ddlsim.simulator.resources import FifoServer

MODES = ("compiled", "python")


def prim(name: str, mode: str):
    """The primitive ``name``, compiled (numba's dispatcher) or its plain-Python function."""
    fn = getattr(fast_core, name)
    return getattr(fn, "py_func", fn) if mode == "python" else fn


@pytest.mark.parametrize("mode", MODES)
def test_reserve_keeps_fifoserver_s_lindley_recursion_and_figures(mode) -> None:
    reserve = prim("reserve", mode)
    rng = np.random.default_rng(3)
    ref, row = FifoServer("s"), np.zeros((2, fast_core.FIFO_FIELDS))
    t = 0.0
    for _ in range(500):
        t += float(rng.exponential(1.0)) * (rng.random() < 0.8)  # ties too
        service = float(rng.exponential(1.2))
        assert reserve(row, 1, t, service) == ref.reserve(t, service)
    assert row[1, fast_core.BUSY] == ref.busy_s and row[1, fast_core.WAIT] == ref.wait_s
    assert row[1, fast_core.SERVED] == ref.served and row[1, fast_core.FREE_AT] == ref.free_at
    assert not row[0].any()
    # a hand case: arrivals 0, 1, 1.5 with services 2, 1, 0.25 end at 2, 3, 3.25 (waits 1, 1.5)
    row = np.zeros((1, fast_core.FIFO_FIELDS))
    assert [reserve(row, 0, a, s) for a, s in ((0.0, 2.0), (1.0, 1.0), (1.5, 0.25))] == [2.0, 3.0, 3.25]
    assert row[0, fast_core.WAIT] == 2.5


@pytest.mark.parametrize("mode", MODES)
def test_reserve_refuses_an_arrival_before_the_previous_one_as_fifoserver_does(mode) -> None:
    reserve = prim("reserve", mode)
    row, ref = np.zeros((1, fast_core.FIFO_FIELDS)), FifoServer("s")
    reserve(row, 0, 1.0, 0.5)
    ref.reserve(1.0, 0.5)
    before = row.copy()
    with pytest.raises(ValueError):
        ref.reserve(0.5, 0.1)
    with pytest.raises(ValueError, match="arrived before the previous one"):
        reserve(row, 0, 0.5, 0.1)
    assert (row == before).all()  # refused: nothing changed
    assert reserve(row, 0, 1.0 - 1e-10, 0.5) == ref.reserve(1.0 - 1e-10, 0.5)  # within 1e-9: accepted by both


@pytest.mark.parametrize("mode", MODES)
def test_the_event_heap_pops_in_heapq_s_order_of_time_then_counter(mode) -> None:
    push, pop = prim("heap_push", mode), prim("heap_pop", mode)
    rng = np.random.default_rng(5)
    ht, hk, hs = np.zeros(400), np.zeros(400, np.int64), np.zeros(400, np.int64)
    ref: list[tuple[float, int, int]] = []
    n, key, popped, expected = 0, 0, [], []
    for _ in range(1500):
        if n and rng.random() < 0.45:
            popped.append((ht[0], hk[0], hs[0]))
            n = pop(ht, hk, hs, n)
            expected.append(heapq.heappop(ref))
        elif n < 400:
            t = float(rng.integers(0, 20))  # many equal times: the counter decides
            slot = int(rng.integers(0, 99))
            n = push(ht, hk, hs, n, t, key, slot)
            heapq.heappush(ref, (t, key, slot))
            key += 1
    assert popped == expected and len(popped) > 500


@pytest.mark.parametrize("mode", MODES)
def test_the_stall_walk_ends_where_learnerclock_ends_and_resumes_after_a_refill(mode) -> None:
    walk, finish = prim("walk_stalls", mode), prim("finish_work", mode)
    rate, mean = 40.0, 0.02
    seed = 11
    clock = LearnerClock(DrawStream(lambda n: np.full(n, 1.0)), rate, mean, np.random.default_rng(seed))
    twin = np.random.default_rng(seed)  # the same stream: the first stall, then the walk's draws
    s0 = float(twin.exponential(1 / rate))
    stall = np.array([[s0, s0 + float(twin.exponential(mean))]])
    draws = twin.standard_exponential(20_000)
    keep = np.zeros(8)
    given = 6  # the draws at hand, refilled 6 at a time: walks stop and resume
    sdraw, spos, slen = np.zeros((1, draws.size)), np.zeros(1, np.int64), np.array([given], np.int64)
    sdraw[0] = draws
    t, resumed = 0.0, 0
    for work in np.random.default_rng(2).uniform(0.01, 0.3, 200):
        want = clock.finish(t, float(work))
        end = finish(0, t, float(work), stall, sdraw, spos, slen, 1 / rate, mean, keep)
        while end < 0.0:
            resumed += 1
            slen[0] += given
            end = walk(0, keep[fast_core.WALK_T], keep[fast_core.WALK_LEFT], stall, sdraw, spos, slen, 1 / rate, mean,
                       keep)
        assert end == want
        t = want + 0.001
    assert resumed > 10
    assert (stall[0, 0], stall[0, 1]) == (clock._s, clock._e)


@pytest.mark.parametrize("mode", MODES)
def test_cadence_shard_layout_sort_and_transfer_time_are_the_reference_rules(mode) -> None:
    due, start = prim("cadence_due", mode), prim("shard_start", mode)
    for end in (None, 4_000):
        cad, mark = EvalCadence(1_000, 3, end), np.array([0.0, 1_000 / 3])
        samples = 0
        for step in np.random.default_rng(1).integers(1, 200, 100):
            samples += int(step)
            assert due(mark, 1, 1_000 / 3, samples, math.inf if end is None else end) == cad.due(samples)
            assert mark[1] == cad.next
    for lam, mu, n in ((3, 4, 100), (7, 1, 50), (4, 64, 10)):
        layout = ShardLayout(lam, mu, n)
        for k in range(40):
            for i in range(lam):
                assert start(k, i, mu, n, layout.shard, layout.per_epoch) == layout.start(k, i)
    sort = prim("sort_prefix", mode)
    for n in (0, 1, 5, 32, 33, 200):
        a = np.random.default_rng(n).integers(0, 50, 210)
        want = np.concatenate([np.sort(a[:n]), a[n:]])
        sort(a, n)
        assert (a == want).all()
    tt = prim("transfer_time", mode)
    for nbytes, bw in ((1e6, 1.25e9), (3.0, 7.0), (1e6, math.inf), (0.0, 1.0)):
        assert tt(nbytes, bw) == transfer_time(nbytes, bw) == (0.0 if math.isinf(bw) else nbytes / bw)


def test_kernel_runs_the_same_code_as_plain_python_when_asked() -> None:
    def f(x: float) -> float:
        return 2.0 * x

    assert fast_core.kernel(f, python=True) is f
    assert fast_core.kernel(python=True)(f) is f
    if fast_core.numba is not None and not fast_core.PLAIN:
        assert fast_core.kernel(f) is not f and fast_core.kernel(f)(1.5) == 3.0


SCRIPT = """
import hashlib, sys
from ddlsim.simulator import fast_core, fast_ps, trace as T
from ddlsim.simulator.run import simulate
from ddlsim.scenarios.load import load_text
assert fast_core.PLAIN and fast_ps._kernel.__class__.__name__ == "function"  # plain Python, not compiled
print(hashlib.sha256(T.encode(simulate(load_text(sys.argv[1]).points()[0], "fast").trace)).hexdigest())
"""


STALLS = '[cluster.stragglers]\nstall_rate_per_s = 20.0\nstall_mean_s = 0.002\n'


@pytest.mark.parametrize("toml", [
    # SSP (the general kernel's release), with stalls
    f'[workload]\nepochs = 0.05\n[cluster]\nlearners = 3\n{STALLS}[protocol]\nname = "ssp"\nstaleness_bound = 1\n',
    # async on the plain kernel
    '[workload]\nepochs = 0.5\n[cluster]\nlearners = 4\n[protocol]\nname = "async"\n',
    # async with buckets, two GPUs a node and stalls: the general kernel's bucket, node-link and resume paths
    f'[workload]\nepochs = 0.5\n[cluster]\nlearners = 4\ngpus_per_node = 2\n{STALLS}[protocol]\nname = "async"\n'
    'bucket_bytes = 10000\n',
], ids=["ssp-stalls", "async-plain", "async-buckets-nodes"])
def test_ddlsim_no_numba_runs_the_fast_engines_as_plain_python_with_the_same_trace(toml: str) -> None:
    """The same code as plain Python (numpy indexing: an index ``ix`` makes unsigned but that is
    negative raises there, where compiled code would read out of bounds) gives the same trace."""
    import hashlib

    from ddlsim.scenarios.load import load_text
    from ddlsim.simulator import trace as T
    from ddlsim.simulator.run import simulate

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), DDLSIM_NO_NUMBA="1")
    run = subprocess.run([sys.executable, "-c", SCRIPT, toml], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    compiled = hashlib.sha256(T.encode(simulate(load_text(toml).points()[0], "fast").trace)).hexdigest()
    assert run.stdout.strip() == compiled


def test_the_fast_engine_s_compute_draws_grow_with_the_run_not_with_the_learners() -> None:
    # λ = 1024 learners, 1,437 gradients (one digits epoch at μ = 1): each learner starts with
    # its share of the run and a margin, ⌈1.25 · 1437 / 1024⌉ + WORK_MARGIN = 18 draws (not a
    # 4,096-draw chunk each: 32 MB), and the trace is still the SimPy engine's
    from unittest.mock import patch

    from ddlsim.simulator import fast_ps
    from ddlsim.simulator import trace as T
    from ddlsim.simulator.run import simulate
    from ddlsim.tests.conftest import make_point

    p = make_point(protocol__name="async", cluster__learners=1024, cluster__minibatch=1, workload__epochs=1)
    shapes = []
    real = fast_ps.Buffers

    def recording(rows: int, cap: int):
        shapes.append((rows, cap))
        return real(rows, cap)

    with patch.object(fast_ps, "Buffers", recording):
        fast = simulate(p, "fast")
    assert shapes[0] == (1024, math.ceil(1.25 * 1437 / 1024) + fast_ps.WORK_MARGIN) == (1024, 18)
    assert T.encode(fast.trace) == T.encode(simulate(p, "simpy").trace)


@pytest.mark.parametrize("mode", MODES)
def test_an_eval_is_due_each_time_the_samples_cross_a_multiple_of_the_spacing(mode) -> None:
    # every = 1000 / 4 = 250 samples, exact in binary: marks are the multiples of 250, so an
    # eval is due exactly when ⌊samples / 250⌋ grows, and never at or past the end
    due = prim("cadence_due", mode)
    for end in (math.inf, 3_000):
        mark, prev, seen = np.array([250.0]), 0, 0
        for step in np.random.default_rng(4).integers(1, 400, 60):
            samples = prev + int(step)
            want = samples // 250 > prev // 250 and samples < end
            assert due(mark, 0, 250.0, samples, end) == want
            seen += want
            if want:
                assert mark[0] == (samples // 250 + 1) * 250
            prev = samples
        assert seen >= 5
    # the shard layout by hand: 100 samples, 3 learners (shards of 33), μ = 4 (8 minibatches a
    # shard): learner 2's 10th minibatch (k = 9) is the second of its shard in epoch 1
    assert prim("shard_start", mode)(9, 2, 4, 100, 33, 8) == 100 + 2 * 33 + 1 * 4
    assert prim("slice_start", mode)(9, 2, 3, 4) == (9 * 3 + 2) * 4
