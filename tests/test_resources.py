"""FifoServer's reservation arithmetic against SimPy's own FIFO Resource."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from ddlsim.simulator.resources import FifoServer


def simpy_fifo(arrivals: list[float], services: list[float]) -> list[tuple[int, float]]:
    """Completion log of a simpy.Resource(capacity=1) fed the same requests (the truth)."""
    env = simpy.Environment()
    res = simpy.Resource(env, capacity=1)
    log: list[tuple[int, float]] = []

    def customer(i: int):
        yield env.timeout(arrivals[i])
        with res.request() as req:
            yield req
            yield env.timeout(services[i])
            log.append((i, env.now))

    for i in range(len(arrivals)):
        env.process(customer(i))
    env.run()
    return sorted(log)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fifo_reservation_equals_simpy_resource(seed: int) -> None:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0, 300)).tolist()
    services = rng.exponential(0.9, 300).tolist()
    server = FifoServer()
    mine = [(i, server.reserve(a, s)) for i, (a, s) in enumerate(zip(arrivals, services))]
    truth = simpy_fifo(arrivals, services)
    assert [i for i, _ in mine] == [i for i, _ in truth]
    assert np.allclose([t for _, t in mine], [t for _, t in truth], rtol=0, atol=1e-9)


def test_hand_computed_log_and_figures() -> None:
    # Lindley by hand: arrivals 0, 1, 1.5, 7 with service 2 → ends 2, 4, 6, 9 (waits 0, 1, 2.5, 0)
    s = FifoServer("link")
    assert [s.reserve(a, 2.0) for a in (0.0, 1.0, 1.5, 7.0)] == [2.0, 4.0, 6.0, 9.0]
    assert s.busy_s == 8.0
    assert s.mean_wait() == pytest.approx((0 + 1 + 2.5 + 0) / 4)
    assert s.utilization(10.0) == pytest.approx(0.8)


def test_out_of_order_arrival_is_refused() -> None:
    s = FifoServer("nic")
    s.reserve(5.0, 1.0)
    with pytest.raises(ValueError, match="nic"):
        s.reserve(1.0, 1.0)


def test_wake_fires_in_the_order_and_at_the_times_of_simpy_timeouts() -> None:
    # Truth: SimPy's own Timeout events scheduled with the same delays (ties FIFO)
    import simpy
    from simpy.core import NORMAL

    from ddlsim.simulator.events import Wake, at

    delays = [0.5, 0.1, 0.5, 0.0, 0.3, 0.1, 0.5]
    env, seen = simpy.Environment(), []
    for k, d in enumerate(delays):
        env.schedule(Wake(lambda ev: seen.append((env.now, ev.payload)), k), NORMAL, d)
    at(env, 0.2, lambda ev: seen.append((env.now, ev.payload)), "at")
    env.run()
    ref_env, ref = simpy.Environment(), []
    for k, d in enumerate(delays):
        ref_env.timeout(d, k).callbacks.append(lambda ev: ref.append((ref_env.now, ev.value)))
    ref_env.timeout(0.2, "at").callbacks.append(lambda ev: ref.append((ref_env.now, ev.value)))
    ref_env.run()
    assert seen == ref


def test_wakes_pushed_on_the_heap_and_re_armed_fire_as_simpy_timeouts() -> None:
    # Truth: SimPy's own Timeout events. Each of three actors re-arms its one Wake from its own
    # callback and pushes it straight onto the heap (event_queue), as the PS engine's learners do.
    from heapq import heappush

    import simpy
    from simpy.core import NORMAL

    from ddlsim.simulator.events import Wake, event_queue

    steps = {0: [0.3, 0.0, 0.2, 0.1], 1: [0.1, 0.2, 0.0, 0.2], 2: [0.0, 0.3, 0.3, 0.0]}
    env, seen = simpy.Environment(), []
    queue, ids = event_queue(env)

    def fire(ev: Wake) -> None:
        actor, n, now = ev.payload
        seen.append((env.now, actor, n))
        assert now == env.now  # the time carried is SimPy's now
        if n + 1 < len(steps[actor]):
            delay = steps[actor][n + 1]
            ev.callbacks, ev.payload = cbs, (actor, n + 1, now + delay)
            heappush(queue, (now + delay, NORMAL, next(ids), ev))

    cbs = [fire]
    for actor, ds in steps.items():
        env.schedule(Wake(fire, (actor, 0, ds[0])), NORMAL, ds[0])
    env.run()

    ref_env, ref = simpy.Environment(), []

    def actor_process(actor: int):
        for n, d in enumerate(steps[actor]):
            yield ref_env.timeout(d)
            ref.append((ref_env.now, actor, n))

    for actor in steps:
        ref_env.process(actor_process(actor))
    ref_env.run()
    assert sorted(seen) == sorted(ref) and len(seen) == 12
    # ties at equal times run in scheduling order in both
    assert [s[:2] for s in seen] == [r[:2] for r in ref]
