"""Compressed averaging (backends/compression.py) against independent truths: NumPy's float16
cast and a bit-level bfloat16 rounding, DDP's own comm hooks run in a 2-process gloo group,
a NumPy SVD, low-rank matrices PowerSGD must send exactly, and error feedback's telescoping sum."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from ddlsim.backends.compression import (
    PowerSGDState,
    half_average,
    mean_average,
    orthogonalize_,
    round_trip,
)
from ddlsim.backends.optim import OuterOptimizer, pseudo_gradient
from ddlsim.simulator.compression_bytes import (
    allreduce_payloads,
    bytes_sent,
    compression_active,
    powersgd_compresses,
    powersgd_flops,
)

SHAPES = [(6, 8), (6,), (8, 6), (8,), (6, 2, 2, 2), (6,), (3, 8), (3,)]


def bf16_numpy(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 → float32 by bits: round to nearest, ties to even, on the top 16 bits."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def test_round_trip_matches_numpy_float16_and_bit_level_bfloat16() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.integers(-6, 5, 1000),
                        [0.0, -0.0, 1.0, 65504.0, 1e-8, 3.0000001]]).astype(np.float32)
    t = torch.from_numpy(x)
    assert np.array_equal(round_trip(t, "fp16").numpy(), x.astype(np.float16).astype(np.float32))
    assert np.array_equal(round_trip(t, "bf16").numpy(), bf16_numpy(x))
    assert round_trip(t, "fp16").dtype == torch.float32


def test_half_average_of_one_node_is_its_round_trip_and_mean_average_is_the_mean() -> None:
    g = [torch.randn(5, 3, generator=torch.Generator().manual_seed(1))]
    assert torch.equal(half_average([g], "fp16")[0], round_trip(g[0], "fp16"))
    two = [[torch.full((4,), 1.0)], [torch.full((4,), 3.0)]]
    assert torch.equal(mean_average(two)[0], torch.full((4,), 2.0))
    # fp16 sums in fp16: 2049/2 + 2049/2 rounds each half (1024.5 → 1024) and the sum stays 2048
    big = [[torch.full((1,), 2049.0)], [torch.full((1,), 2049.0)]]
    assert half_average(big, "fp16")[0].item() == 2048.0


# ---- the bytes formula -------------------------------------------------------------------------

def test_bytes_by_hand() -> None:
    shapes = [(100, 50), (50,), (10, 3, 3, 3), (4, 4)]
    total = 5000 + 50 + 270 + 16
    assert bytes_sent(shapes, "none") == 4 * total
    assert bytes_sent(shapes, "fp16") == bytes_sent(shapes, "bf16") == 2 * total
    # rank 2: 100×50 → 2·150 = 300 elements; 10×27 → 2·37 = 74 < 270; 4×4: 2·8 = 16, not < 16 → plain
    assert allreduce_payloads(shapes, "powersgd", 2) == (4 * (50 + 16), 4 * (200 + 20), 4 * (100 + 54))
    assert bytes_sent(shapes, "powersgd", 2) == 4 * (66 + 300 + 74)
    # a rank at or above the smaller side sends the matrix exactly (uncompressed)
    assert not powersgd_compresses((10, 27), 10) and not powersgd_compresses((100, 50), 50)
    assert bytes_sent([(100, 50)], "powersgd", 50) == 4 * 5000
    # torch's default min_compression_rate 2: 10×27 at rank 2 needs 2·74 < 270 → still compressed; at rank 4 not
    assert powersgd_compresses((10, 27), 2, 2.0) and not powersgd_compresses((10, 27), 4, 2.0)
    assert powersgd_flops([(100, 50)], 2) == 3 * 2 * 5000 * 2 + 4 * 100 * 4 + 2 * 5000
    assert [compression_active("powersgd", s, 2) for s in range(4)] == [False, False, True, True]
    assert compression_active("fp16", 0, 5) and not compression_active("none", 9)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_rank_names_the_key(bad: object) -> None:
    with pytest.raises(ValueError, match=r"protocol\.powersgd_rank"):
        bytes_sent([(4, 4)], "powersgd", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"protocol\.compression = 'int8'"):
        bytes_sent([(4, 4)], "int8")


# ---- PowerSGD against exact truths ------------------------------------------------------------

def test_rank_at_least_the_matrices_rank_sends_them_exactly() -> None:
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(20, 2, generator=gen, dtype=torch.float64)  # every node's matrix in one 2-D column space
    for batched in (False, True):
        state = PowerSGDState(2, warmup=0, seed=4, batched=batched)
        for step in range(3):
            nodes = [[u @ torch.randn(2, 16, generator=gen, dtype=torch.float64), torch.randn(20, generator=gen,
                                                                                              dtype=torch.float64)]
                     for _ in range(3)]
            got = state.average(nodes, step)
            want = [sum(n[k] for n in nodes) / 3 for k in range(2)]
            assert state.compressed == [0]
            for a, b in zip(got, want):
                assert torch.allclose(a, b, atol=1e-12, rtol=0)


def test_compression_error_is_above_the_svd_optimum_and_falls_with_rank() -> None:
    rng = np.random.default_rng(7)
    u, _ = np.linalg.qr(rng.standard_normal((40, 30)))
    v, _ = np.linalg.qr(rng.standard_normal((30, 30)))
    sigma = 0.6 ** np.arange(30)
    m = (u * sigma) @ v.T
    uu, ss, vv = np.linalg.svd(m)
    errors = []
    for r in (1, 2, 3, 4, 6, 8):
        best = np.linalg.norm(m - (uu[:, :r] * ss[:r]) @ vv[:r])
        errs = []
        for seed in range(8):  # one power iteration from a random Q: its mean error over the draws
            approx = PowerSGDState(r, warmup=0, seed=seed).average([[torch.from_numpy(m)]], 0)[0].numpy()
            errs.append(np.linalg.norm(m - approx))
        assert min(errs) >= best * (1 - 1e-12)
        errors.append(float(np.mean(errs)))
    assert all(a > b for a, b in itertools.pairwise(errors)), errors


def test_error_feedback_telescopes_and_stays_bounded() -> None:
    """Σ_t received_t = Σ_t mean_i g_i,t − mean_i e_i,T exactly (sent = M − e'); the
    difference stays bounded while the sum grows, unlike the same compression without memory."""
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(12, 10, generator=gen, dtype=torch.float64)
    state = PowerSGDState(1, warmup=0, seed=1)
    total_sent = torch.zeros(12, 10, dtype=torch.float64)
    total_mean = torch.zeros_like(total_sent)
    no_memory = torch.zeros_like(total_sent)
    gaps = []
    for t in range(200):
        nodes = [[base + 0.3 * torch.randn(12, 10, generator=gen, dtype=torch.float64)] for _ in range(2)]
        total_sent += state.average(nodes, t)[0]
        total_mean += (nodes[0][0] + nodes[1][0]) / 2
        fresh = PowerSGDState(1, warmup=0, seed=t)  # one step each: no error memory carried
        no_memory += fresh.average(nodes, 0)[0]
        assert state.errors is not None
        residual = (state.errors[0][0] + state.errors[1][0]) / 2
        assert torch.allclose(total_sent, total_mean - residual, atol=1e-9, rtol=0)
        gaps.append(float(torch.linalg.norm(total_sent - total_mean)))
    assert max(gaps[100:]) < 2 * max(gaps[:100]) + 1e-9
    assert max(gaps) < 0.05 * float(torch.linalg.norm(total_mean))
    assert float(torch.linalg.norm(no_memory - total_mean)) > 10 * max(gaps)


def test_orthogonalize_gives_orthonormal_columns_spanning_the_input() -> None:
    gen = torch.Generator().manual_seed(5)
    for r in (1, 2, 3, 5):
        x = torch.randn(4, 9, r, generator=gen, dtype=torch.float64)
        q = orthogonalize_(x.clone())
        eye = torch.eye(r, dtype=torch.float64).expand(4, r, r)
        assert torch.allclose(q.transpose(1, 2) @ q, eye, atol=1e-12)
        assert torch.allclose(q @ (q.transpose(1, 2) @ x), x, atol=1e-12)  # same column space


def test_warmup_steps_are_the_plain_mean_and_leave_no_memory() -> None:
    gen = torch.Generator().manual_seed(2)
    nodes = [[torch.randn(8, 6, generator=gen)] for _ in range(2)]
    state = PowerSGDState(1, warmup=3)
    for s in range(3):
        assert torch.equal(state.average(nodes, s)[0], mean_average(nodes)[0])
    assert state.errors is None
    assert not torch.allclose(state.average(nodes, 3)[0], mean_average(nodes)[0], atol=1e-3)


# ---- DDP's own hooks in a 2-process gloo group --------------------------------------------------

WORKER = textwrap.dedent('''
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 6)
            self.b = nn.Linear(6, 8)
            self.c = nn.Conv1d(8, 6, 2)   # weight (6, 8, 2): an (6, 16) matrix
            self.d = nn.Linear(8, 6)      # the same matrix shape as a: grouped with it
            self.e = nn.Linear(6, 3)
        def forward(self, x):
            h = torch.tanh(self.b(torch.tanh(self.a(x))))
            h = torch.tanh(self.c(torch.stack([h, h.flip(1)], 2))).sum(2)
            return self.e(torch.tanh(self.d(torch.cat([h, h[:, :2]], 1))))

    records = {}
    cases = [("allreduce", None), ("fp16", None), ("bf16", None), ("powersgd1", 1), ("powersgd3", 3)]
    for name, r in cases:
        torch.manual_seed(0)
        model = DDP(Net(), bucket_cap_mb=25)
        log = []
        if r is None:
            inner = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
                     "bf16": default_hooks.bf16_compress_hook}[name]
            state = None
        else:
            inner = ps.powerSGD_hook
            state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                     min_compression_rate=1, random_seed=9)
        def hook(st, bucket, inner=inner, log=log):
            pre = [g.detach().clone() for g in bucket.gradients()]
            shapes = [g.shape for g in bucket.gradients()]
            def done(fut):
                flat = fut.value() if isinstance(fut.value(), torch.Tensor) else fut.value()[0]
                post, i = [], 0
                for s in shapes:
                    k = s.numel()
                    post.append(flat[i:i + k].view(s).clone())
                    i += k
                log.append((pre, post))
                return flat
            return inner(st, bucket).then(done)
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100 + rank)
        for step in range(5):
            x = torch.randn(5, 8, generator=g)
            loss = (model(x) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        records[name] = log
    torch.save(records, out)
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def hook_records(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    d = tmp_path_factory.mktemp("hooks")
    script = d / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(d / "store"), str(d / f"r{r}.pt")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out.decode()[-3000:]
    return torch.load(Path(d / "r0.pt")), torch.load(Path(d / "r1.pt"))


def _steps(records: tuple[dict, dict], name: str) -> list[tuple[list, list, list]]:
    r0, r1 = records[0][name], records[1][name]
    assert len(r0) == len(r1) == 5
    for (_, post0), (_, post1) in zip(r0, r1):
        for a, b in zip(post0, post1):
            assert torch.equal(a, b)  # every rank receives the same
    return [(pre0, pre1, post0) for (pre0, post0), (pre1, _) in zip(r0, r1)]


@pytest.mark.live
@pytest.mark.parametrize("name", ["allreduce", "fp16", "bf16"])
def test_mean_and_half_averages_are_ddps_hooks_bit_for_bit(hook_records: tuple[dict, dict], name: str) -> None:
    for pre0, pre1, post in _steps(hook_records, name):
        got = mean_average([pre0, pre1]) if name == "allreduce" else half_average([pre0, pre1], name)
        for a, b in zip(got, post):
            assert torch.equal(a, b)


@pytest.mark.live
@pytest.mark.parametrize("name,rank", [("powersgd1", 1), ("powersgd3", 3)])
@pytest.mark.parametrize("batched", [False, True])
def test_powersgd_is_ddps_powersgd_hook(hook_records: tuple[dict, dict], name: str, rank: int,
                                        batched: bool) -> None:
    state = PowerSGDState(rank, warmup=2, seed=9, batched=batched)
    worst = 0.0
    for step, (pre0, pre1, post) in enumerate(_steps(hook_records, name)):
        got = state.average([pre0, pre1], step)
        for a, b in zip(got, post):
            if not batched:
                assert torch.equal(a, b), (step, float((a - b).abs().max()))
            worst = max(worst, float((a - b).abs().max() / (b.abs().max() + 1e-30)))
    assert worst <= 1e-6
    # by hand: every weight at rank 1; at rank 3 e (3 × 6) would send 3·9 > 18, so it goes whole
    assert len(state.compressed) == {1: 5, 3: 4}[rank]


# ---- DiLoCo's outer step (backends/optim.py) ---------------------------------------------------

@pytest.mark.parametrize("lr,momentum", [(0.7, 0.9), (1.0, 0.0), (0.3, 0.5)])
def test_outer_step_is_torch_sgd_nesterov_on_the_pseudo_gradient(lr: float, momentum: float) -> None:
    gen = torch.Generator().manual_seed(21)
    theta = torch.randn(30, generator=gen)
    ref = torch.nn.Parameter(theta.clone())
    torch_opt = torch.optim.SGD([ref], lr=lr, momentum=momentum, nesterov=momentum > 0)
    outer = OuterOptimizer(lr, momentum)
    rows_x = torch.stack([theta.clone(), theta.clone()])
    rows_buf = torch.zeros_like(rows_x)
    for _ in range(6):
        locals_ = [theta + 0.1 * torch.randn(30, generator=gen) for _ in range(4)]
        delta = pseudo_gradient(theta, locals_)
        want_delta = theta.double().numpy() - np.mean([x.double().numpy() for x in locals_], axis=0)
        assert np.allclose(delta.double().numpy(), want_delta, atol=1e-6, rtol=0)
        ref.grad = delta.clone()
        torch_opt.step()
        outer.step_rows_(rows_x, torch.stack([delta, delta]), rows_buf)
        theta = outer.step_delta(theta, delta)
        # torch's buffer is buf·μ then + Δ (two roundings), sgd_update's Δ + μ·buf: float rounding apart
        assert torch.allclose(theta, ref.detach(), atol=1e-6, rtol=0)
        assert torch.equal(rows_x[0], theta) and torch.equal(rows_x[1], theta)


def test_outer_sgd_at_rate_one_without_momentum_lands_on_the_mean() -> None:
    gen = torch.Generator().manual_seed(22)
    theta = torch.randn(50, generator=gen, dtype=torch.float64)
    locals_ = [theta + torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(3)]
    new = OuterOptimizer(1.0, 0.0).step(theta, locals_)
    assert torch.allclose(new, torch.stack(locals_).mean(0), atol=1e-14, rtol=0)


@pytest.mark.parametrize("lr,momentum,key", [(0.0, 0.5, "outer_lr"), (float("nan"), 0.5, "outer_lr"),
                                             (1.0, 1.0, "outer_momentum"), (1.0, -0.1, "outer_momentum")])
def test_outer_optimizer_refuses_bad_values(lr: float, momentum: float, key: str) -> None:
    with pytest.raises(ValueError, match=rf"protocol\.{key} = "):
        OuterOptimizer(lr, momentum)
