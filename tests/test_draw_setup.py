"""The set-up's draws and trace columns, made cheaper, are the same values.

* NumPy's ``Generator`` fills an array sequentially: one call of n draws equals the same
  method's calls in pieces summing to n (checked per distribution the engines draw from);
* the learners' clocks draw what NumPy's documented ``SeedSequence.spawn`` recipe gives
  (learner i: child i + 1 of ``[seed, CLOCKS]``, its children 0 for compute, 1 for stalls);
* the fast engine's one-allocation trace columns hold ``blank_columns``' names, dtypes and defaults.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.scenarios.load import load_text
from ddlsim.simulator import seeds
from ddlsim.simulator.compute import learner_clocks
from ddlsim.simulator.fast_core import block_columns
from ddlsim.simulator.trace import blank_columns

DRAWS = {
    "exponential": lambda g, n: g.exponential(3e-5, n),
    "lognormal": lambda g, n: g.lognormal(-5.0, 0.2, n),
    "standard_exponential": lambda g, n: g.standard_exponential(n),
}


@pytest.mark.parametrize("name", sorted(DRAWS))
@pytest.mark.parametrize("pieces", [[1, 1, 5], [4096, 4096, 17], [3, 10_000, 1, 999]])
def test_one_call_equals_the_same_draws_in_pieces(name: str, pieces: list[int]) -> None:
    draw = DRAWS[name]
    whole = draw(np.random.default_rng(123), sum(pieces))
    g = np.random.default_rng(123)
    cut = np.concatenate([draw(g, n) for n in pieces])
    assert whole.tobytes() == cut.tobytes()


POINT = """
[workload]
dataset = "cifar10"
model = "rudra_cifar"
epochs = 1
[cluster]
learners = 6
minibatch = 4
[cluster.compute]
distribution = "lognormal"
base_s = 0.002
per_sample_s = 0.0005
cv = 0.3
[cluster.stragglers]
fraction = 0.34
slowdown = 3.0
{stalls}
[protocol]
name = "async"
"""


@pytest.mark.parametrize("stalls", ["", "stall_rate_per_s = 20.0\nstall_mean_s = 0.01"])
def test_clocks_draw_numpy_s_spawn_recipe(stalls: str) -> None:
    p = load_text(POINT.format(stalls=stalls)).points()[0]
    lam, seed = 6, int(p["seed"])
    clocks = learner_clocks(p, lam)
    top = np.random.SeedSequence([seed, seeds.CLOCKS]).spawn(lam + 1)
    slow = set(np.random.default_rng(top[0]).permutation(lam)[:round(0.34 * lam)].tolist())
    mean, s2 = 0.002 + 0.0005 * 4, np.log1p(0.3 ** 2)
    for i, clock in enumerate(clocks):
        draw_ss, stall_ss = top[i + 1].spawn(2)
        m = mean * (3.0 if i in slow else 1.0)
        want = np.random.default_rng(draw_ss).lognormal(np.log(m) - s2 / 2, np.sqrt(s2), 50)
        assert [clock.draws.next() for _ in range(50)] == want.tolist()
        stall_rng = np.random.default_rng(stall_ss)
        if stalls:
            s = stall_rng.exponential(1 / 20.0)
            assert (clock._s, clock._e) == (s, s + stall_rng.exponential(0.01))
        else:
            assert clock.stall_free
        assert clock._rng.standard_exponential(5).tolist() == stall_rng.standard_exponential(5).tolist()


@pytest.mark.parametrize("n_ops, n_inputs", [(0, 0), (1, 1), (7, 3), (50_001, 25_003)])
def test_block_columns_hold_blank_columns_defaults(n_ops: int, n_inputs: int) -> None:
    for want, got in zip(blank_columns(n_ops, n_inputs), block_columns(n_ops, n_inputs)):
        assert list(got) == list(want)
        for name, col in got.items():
            assert col.dtype == want[name].dtype and col.shape == want[name].shape
            assert col.tobytes() == want[name].tobytes()
            assert col.flags.c_contiguous and col.flags.writeable and col.ctypes.data % col.itemsize == 0
    ops, _ = block_columns(10, 0)
    for value, col in enumerate(ops.values()):  # the columns do not overlap
        col[:] = value
    assert [col.tolist() for col in ops.values()] == [[value] * 10 for value in range(len(ops))]
