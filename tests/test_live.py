"""The live backend: real processes over torch.distributed (gloo on 127.0.0.1), λ ≤ 4."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from ddlsim.backends.base import BackendError, RunOptions
from ddlsim.backends.live import LiveBackend
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.optim import Optimizer
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.simulator.dataorder import SampleStream
from ddlsim.simulator.mixing import symmetric_matrix
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

pytestmark = [pytest.mark.live, pytest.mark.filterwarnings("ignore::UserWarning")]

BASE = """
seed = 5
[workload]
epochs = {epochs}
[cluster]
learners = {learners}
minibatch = {mb}
[cluster.compute]
distribution = "{dist}"
base_s = {base}
per_sample_s = 0.0
[optimizer]
lr = 0.1
momentum = 0.9
lr_policy = "{policy}"
[protocol]
name = "{protocol}"
[live]
compute = "{compute}"
timeout_s = {timeout}
"""


def point(protocol: str, *, learners: int = 3, mb: int = 8, epochs: float = 1, compute: str = "real",
          dist: str = "deterministic", base: float = 0.0, policy: str = "constant", timeout: float = 30,
          **sets) -> dict:
    return make_point(BASE.format(protocol=protocol, learners=learners, mb=mb, epochs=epochs, compute=compute,
                                  dist=dist, base=base, policy=policy, timeout=timeout), **sets)


def live(p: dict):
    return LiveBackend().run(simulate(p).trace, p, RunOptions(device="cpu", threads=1))


def replay_final(trace, p: dict) -> torch.Tensor:
    torch.set_num_threads(1)
    rep = Replayer(trace, build_model(p), load_data(p), Optimizer(p["optimizer"], trace.header["mean_staleness"]),
                   batched=False)
    rep.run()
    return rep.final_states()[0][0]


@pytest.mark.parametrize("protocol,policy", [("async", "per_gradient"), ("softsync", "constant")])
def test_replaying_the_measured_trace_reproduces_the_live_weights(protocol: str, policy: str) -> None:
    # Truth: the live server's final weights; replay never saw them, only the measured trace.
    p = point(protocol, policy=policy, protocol__n=1)
    r = live(p)
    assert r.trace.header["measured"] and int(r.trace.inputs["staleness"].max()) >= (1 if protocol == "async" else 0)
    assert torch.allclose(replay_final(r.trace, p), r.final_weights, atol=1e-5, rtol=0)


def test_live_hardsync_equals_single_learner_sgd_with_lambda_mu() -> None:
    # Truth: a plain torch.optim.SGD loop, one learner, minibatch λμ, the same data order.
    lam, mu = 3, 8
    p = point("hardsync", learners=lam, mb=mu)
    r = live(p)
    torch.manual_seed(0)
    model = build_model(p)
    data = load_data(p)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stream = SampleStream(p["seed"], p["workload"]["samples_per_epoch"])
    rounds = int(r.trace.ops["kind"].tolist().count(1))
    for k in range(rounds):
        idx = torch.from_numpy(stream.indices(k * lam * mu, lam * mu))
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        sgd.step()
    ref = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    assert torch.allclose(r.final_weights, ref, atol=1e-5, rtol=0)


def test_a_killed_learner_stops_the_run_with_a_clear_error() -> None:
    # Truth: the fault injected — learner 1 kills itself (SIGKILL) after its first gradient.
    p = point("async", epochs=5, timeout=20, live__fail_learner=1, live__fail_after=1)
    with pytest.raises(BackendError, match=r"learner 1 died with signal SIGKILL") as e:
        live(p)
    assert "\n" not in str(e.value)  # (no wall-clock bound: the machine is shared; a hang would hit the timeout)


def staleness_from_apply_order(trace) -> np.ndarray:
    """Async's staleness re-derived from the order of the server's applies alone: a learner's
    next gradient reads the version its previous apply made, so its σ is the number of other
    learners' applies since then (since the start for its first)."""
    ops, inp = trace.ops, trace.inputs
    applies = np.flatnonzero(ops["kind"] == 1)
    pusher = ops["node"][inp["grad_op"][ops["in_start"][applies]]]
    last: dict[int, int] = {}
    out = np.empty(len(applies), dtype=np.int64)
    for n, i in enumerate(pusher.tolist()):
        out[n] = n - last.get(i, 0)
        last[i] = n + 1
    return out


def test_live_async_staleness_is_what_the_order_of_its_applies_implies() -> None:
    # Truth: async's rule re-derived by hand from the order of applies (staleness_from_apply_order),
    # which holds whatever the load on the machine; the simulator's trace keeps the same rule.
    # How well a calibrated latency predicts the measured distribution is a measurement
    # (docs/validation.md, the σ columns), not a test: it moves with the load.
    p = point("async", learners=4, mb=4, epochs=1, compute="emulated", dist="exponential", base=0.01,
              cluster__server__apply_s=1e-4, seed=9)
    r = LiveBackend().run(simulate(p).trace, p, RunOptions(device="cpu"))
    for trace in (r.trace, simulate(p).trace):
        ops, inp = trace.ops, trace.inputs
        applies = np.flatnonzero(ops["kind"] == 1)
        assert (ops["in_count"][applies] == 1).all()
        assert np.array_equal(inp["staleness"][ops["in_start"][applies]], staleness_from_apply_order(trace))
        grads = inp["grad_op"][ops["in_start"][applies]]
        assert np.array_equal(ops["version"][applies] - ops["src_version"][grads],
                              inp["staleness"][ops["in_start"][applies]])
    s = r.trace.inputs["staleness"]
    assert 0 < s.mean() <= p["cluster"]["learners"] - 1  # each learner's σ sum ≤ the others' applies
    # the run's time is a measurement (docs/validation.md: load on a shared machine lengthens it);
    # what no load changes: it lasted at least each learner's computations one after another
    ops = r.trace.ops
    grads = ops["kind"] == 0
    busiest = max(float((ops["t_end"] - ops["t_start"])[grads & (ops["node"] == i)].sum())
                  for i in np.unique(ops["node"][grads]))
    assert r.summary["measured_time_s"] >= busiest > 0


def worst_lead(trace, lam: int) -> int:
    """Largest k − (gradients the least advanced learner had finished when learner i started
    its k-th): SSP's clock difference seen from finished gradients (independent of the core)."""
    ops = trace.ops
    g = np.flatnonzero(ops["kind"] == 0)
    ends = {i: np.sort(ops["t_end"][g][ops["node"][g] == i]) for i in range(lam)}
    return max(int(ops["batch_index"][x]) - min(int(np.searchsorted(ends[m], ops["t_start"][x], side="right"))
                                               for m in range(lam)) for x in g)


@pytest.mark.parametrize("protocol", ["ssp", "bounded_softsync"])
def test_live_bounded_protocols_keep_the_bound_and_replay_to_the_live_weights(protocol: str) -> None:
    # Truths: SSP's rule on every measured gradient (a straggler makes it bind), and the live
    # server's final weights (replay sees only the measured trace)
    lam = 3
    p = point(protocol, learners=lam, mb=8, epochs=1, dist="deterministic", base=0.004, policy="per_gradient",
              protocol__n=1, protocol__staleness_bound=1, cluster__stragglers__fraction=0.34,
              cluster__stragglers__slowdown=4.0)
    r = live(p)
    assert worst_lead(r.trace, lam) <= 1
    ins = r.trace.ops["in_count"][r.trace.ops["kind"] == 1]
    assert (ins[:-1] == (lam if protocol == "bounded_softsync" else 1)).all()
    assert torch.allclose(replay_final(r.trace, p), r.final_weights, atol=1e-5, rtol=0)


PS_KEYS = [(proto, shards, group) for proto in ("hardsync", "softsync", "async", "ssp", "bounded_softsync")
           for shards in (1, 2) for group in (1, 2)]


@pytest.mark.parametrize("protocol,shards,group", PS_KEYS)
def test_live_runs_or_refuses_every_parameter_server_combination(protocol: str, shards: int, group: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Truth: the simulator accepts every combination; the live backend either runs it (a
    # measured trace with every gradient applied) or refuses it with one line naming the key,
    # before any process starts
    from ddlsim.backends import live as live_mod

    p = point(protocol, learners=4, mb=8, epochs=0.1, compute="emulated", base=0.002, protocol__n=2,
              cluster__server__shards=shards, cluster__server__group_size=group)
    started = []
    real = live_mod.launch
    monkeypatch.setattr(live_mod, "launch", lambda *a: (started.append(1), real(*a)))
    sim = simulate(p)
    if shards == 1 and group == 1:
        r = LiveBackend().run(sim.trace, p, RunOptions(device="cpu"))
        assert started and r.summary["measured_gradients"] == int((r.trace.ops["kind"] == 0).sum()) > 0
        assert len(r.trace.inputs["grad_op"]) == r.summary["measured_gradients"]
    else:
        key = "cluster.server.shards" if shards != 1 else "cluster.server.group_size"
        with pytest.raises(BackendError, match=key) as e:
            LiveBackend().run(sim.trace, p, RunOptions(device="cpu"))
        assert "\n" not in str(e.value) and not started


def test_torchrun_worker_runs_a_point_that_replay_reproduces(tmp_path) -> None:
    # Truth: the weights the torchrun-launched server wrote; replay sees only its trace
    import subprocess
    import sys

    from ddlsim.simulator.trace import read

    scen = tmp_path / "s.toml"
    scen.write_text(BASE.format(protocol="async", learners=2, mb=8, epochs=0.5, compute="real",
                                dist="deterministic", base=0.0, policy="constant", timeout=30))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                           "-m", "ddlsim.scenarios.live_worker", str(scen), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = read(out / "trace.ddlt")
    weights = torch.load(out / "weights.pt", weights_only=True)
    p = point("async", learners=2, mb=8, epochs=0.5)
    assert trace.header["measured"] and torch.allclose(replay_final(trace, p), weights, atol=1e-5, rtol=0)
    # the user's way to accuracy curves from it: `ddlsim replay TRACE` (no scenario needed)
    rep = subprocess.run([sys.executable, "-m", "ddlsim", "replay", str(out / "trace.ddlt"),
                          "--out", str(tmp_path / "rep"), "--device", "cpu", "--no-report"],
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    summary = (tmp_path / "rep" / "summary.csv").read_text().splitlines()
    assert len(summary) == 2 and "measured_time_s" in summary[0]
    bad = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "ddlsim.scenarios.live_worker", str(scen), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "WORLD_SIZE = 2, but this point needs 3 processes" in bad.stderr


def replayed_debiased(trace, p: dict) -> torch.Tensor:
    """Every node's de-biased weights x_i / w_i after replaying ``trace`` (one thread, unbatched)."""
    torch.set_num_threads(1)
    rep = Replayer(trace, build_model(p), load_data(p), Optimizer(p["optimizer"], 0.0), batched=False)
    rep.run()
    fin = rep.final_states()
    return torch.stack([fin[i][0] / fin[i][1] for i in range(len(fin))])


@pytest.mark.parametrize("protocol,overlap", [("allreduce", 0), ("sgp", 0), ("dpsgd", 0), ("dpsgd", 1)])
def test_live_gossip_nodes_are_reproduced_by_replaying_their_trace(protocol: str, overlap: int) -> None:
    # Truth: every node's live de-biased weights x_i / w_i; replay sees only the merged trace.
    p = point(protocol, learners=4, mb=8, protocol__overlap=overlap)
    r = live(p)
    assert torch.allclose(replayed_debiased(r.trace, p), r.final_weights, atol=1e-5, rtol=0)
    if protocol == "allreduce":  # exact averaging: every node holds the same model
        assert torch.allclose(r.final_weights[0], r.final_weights[3], atol=1e-6)
    if protocol == "dpsgd":  # each iteration's mixes are row i of D-PSGD's doubly stochastic W_k
        ops = r.trace.ops
        for i in range(4):
            mine = np.flatnonzero(ops["node"] == i)
            rows, row = [], None
            for op in mine:
                if ops["kind"][op] == 0:  # grad: an iteration starts (blocking: grad, apply, mixes)
                    if row is not None:
                        rows.append(row)
                    row = {}
                elif ops["kind"][op] == 2:  # mix
                    if not row:
                        row[i] = float(ops["self_coef"][op])
                    row[int(ops["src_node"][op])] = float(ops["coef"][op])
            rows.append(row)
            assert len(rows) == r.trace.header["iterations"]
            for k, row in enumerate(rows):
                W = symmetric_matrix(p["protocol"]["topology"], k, 4, p["protocol"]["peers"])
                assert row == pytest.approx({j: W[i, j] for j in range(4) if W[i, j] > 0}, abs=1e-12)


def test_unsupported_live_setting_is_one_clear_line() -> None:
    p = point("hardsync", learners=4, cluster__server__shards=2)
    with pytest.raises(BackendError, match="cluster.server.shards = 2: live hardsync supports only "
                       "cluster.server.shards = 1") as e:
        live(p)
    assert "\n" not in str(e.value)


def _listening(pids: set[int]) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of the TCP sockets in LISTEN state
    that processes ``pids`` hold."""
    import os

    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                    found.add(cols[1].rsplit(":", 1)[0])
    return found


def _descendants(pid: int) -> set[int]:
    import os

    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}/task") else []:
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                kids = []
            todo += [k for k in kids if k not in out]
            out.update(kids)
    return out


@pytest.mark.skipif(not __import__("os").path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_live_processes_listen_on_live_host_only() -> None:
    # truth: docs/live.md — the store and the connections bind to live.host (127.0.0.1 here),
    # read from the kernel's socket table while the run is going
    import os
    import threading

    p = point("async", learners=3, epochs=3, compute="emulated", base=0.002)
    seen: set[str] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(_listening(_descendants(os.getpid())))
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    try:
        live(p)
    finally:
        stop.set()
        t.join()
    assert seen, "no listening socket observed during the run"
    assert seen == {"0100007F"}, seen  # 127.0.0.1 only; all interfaces would read 00000000


def test_a_stopped_learner_is_named_within_seconds() -> None:
    # truth: the learner this test stops with SIGSTOP; live.timeout_s = 3 bounds the wait
    import glob
    import os
    import signal
    import threading

    p = point("async", learners=3, epochs=500, compute="emulated", base=0.002, timeout=3)
    before = set(glob.glob("/tmp/ddlsim-live-*"))

    def stop_learner_1() -> None:
        for _ in range(400):
            new = [d for d in glob.glob("/tmp/ddlsim-live-*/pids") if os.path.dirname(d) not in before]
            if new and os.path.getsize(new[0]):
                time.sleep(4.0)  # past start-up: the learners are working
                os.kill(int(open(new[0]).read().split()[2]), signal.SIGSTOP)  # rank 2 = learner 1
                return
            time.sleep(0.05)

    threading.Thread(target=stop_learner_1, daemon=True).start()
    with pytest.raises(BackendError) as e:
        live(p)  # 500 epochs: without the detection this would run for many minutes
    assert "learner 1 stopped responding" in str(e.value) and "\n" not in str(e.value)


def test_silent_learner_names_the_one_heard_from_least_recently(tmp_path) -> None:
    # hand-made: learner 0 pushed at t = 9, learner 1 at t = 4 (silent longest), learner 2 has
    # finished its work (told to stop) and is not waited for
    from ddlsim.backends.live import _blame
    from ddlsim.backends.live_ps import silent_learner

    p = point("async", learners=3, timeout=3)
    text = silent_learner(p, [9.0, 4.0, 1.0], [False, False, True], now=10.0)
    assert text.startswith("learner 1 sent nothing for 6.0 s (live.timeout_s = 3)")
    (tmp_path / "rank0.err").write_text("Traceback (most recent call last):\n  ...\nRuntimeError: " + text + "\n")
    assert _blame(p, str(tmp_path), []) == f"live run stopped: {text}; the other processes were terminated"
    assert _blame(p, str(tmp_path), [2]).startswith("live run stopped: learner 1 stopped responding")


@pytest.mark.parametrize("protocol,name", [("allreduce", "node 1 made no progress"), ("sgp", "node 1 made no progress"),
                                           ("adpsgd", "node 1 made no progress"),
                                           ("async", "learner 1 sent nothing")])
def test_a_hung_learner_is_named_for_every_live_protocol(protocol: str, name: str) -> None:
    # truth: the fault injected — learner/node 1 hangs (keeps running, never answers) after 2
    # gradients; the others wait live.timeout_s = 3 s; gossip nodes are named by their heartbeat
    p = point(protocol, epochs=2, compute="emulated", timeout=3, live__fail_learner=1, live__fail_after=2,
              live__fail_mode="hang")
    with pytest.raises(BackendError) as e:
        live(p)
    text = str(e.value)
    assert name in text and "\n" not in text and "live.timeout_s = 3" in text, text
    waited = float(text.split(" for ", 1)[1].split(" s", 1)[0])
    assert waited >= 3.0  # named after the timeout, not before (no wall-clock bound: the machine is shared)


def test_laggards_are_the_nodes_behind_every_other(tmp_path) -> None:
    # hand-made heartbeats: nodes 0 and 2 finished 5 gradients, node 1 finished 3 (at t = 7)
    from ddlsim.backends.live import _blame
    from ddlsim.backends.live_faults import BEAT, laggards, read_beats

    beats = [(5, 9.0), (3, 7.0), (5, 8.5)]
    assert laggards(beats) == ([1], 3, 5, 7.0)
    assert laggards([(4, 1.0), (4, 2.0)])[0] == []  # nobody behind: nobody named
    assert laggards([(4, 1.0), None])[0] == []      # a missing beat: no guess
    for r, b in enumerate(beats):
        (tmp_path / f"progress.{r}").write_bytes(BEAT.pack(*b))
    assert read_beats(str(tmp_path), 4) == [*beats, None]
    p = point("allreduce", learners=3, timeout=3)
    text = _blame(p, str(tmp_path), [], "RuntimeError: [gloo] Timed out waiting 3000ms for recv")
    assert text.startswith("live run stopped: node 1 made no progress for ") and "finished 3 gradients, the " \
        "others at least 5; live.timeout_s = 3" in text
    assert _blame(p, str(tmp_path), [], "RuntimeError: Connection closed by peer") is None  # not a timeout
