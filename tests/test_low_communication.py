"""The low-communication answers: the bundled scenario's promise, the bandwidth finding
(which method reaches the same error first at each bandwidth, in every seed) against
hand-built rows, and advise over local SGD / DiLoCo / PowerSGD points against a full replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlsim.analysis.findings import bandwidth_finding, findings, rate
from ddlsim.scenarios.advise import search as A
from ddlsim.scenarios.bundled import resolve_scenario
from ddlsim.scenarios.load import load, load_text
from ddlsim.scenarios.runner import run_sweep


def run(proto: str, bw: float, seed: int, final: float, comp: str = "none", hit: float | None = None) -> dict:
    return {"run_id": f"{proto}-{comp}-{bw:g}-{seed}", "protocol": proto, "learners": 8, "minibatch": 16,
            "seed": seed, "cluster.network.bandwidth_Bps": bw, "protocol.name": proto,
            "protocol.compression": comp, "final_test_error": final, "best_test_error": final,
            "time_to_target_s": hit, "diverged": False, "did_not_learn": False, "error": None}


def curve(r: dict, points: list[tuple[float, float]]) -> list[dict]:
    return [{"run_id": r["run_id"], "sim_time_s": t, "test_error": e} for t, e in points]


def test_rate_reads_as_people_say_it() -> None:
    assert rate(1e6) == "1 MB/s (8 Mb/s)"
    assert rate(1.25e9) == "1.25 GB/s (10 Gb/s)"


def test_bandwidth_finding_by_hand() -> None:
    # two seeds, two bandwidths, two methods; target 0.1. At 1 MB/s DiLoCo reaches 0.1 first
    # in both seeds (1.0 and 1.2 s against 5 and 6 s); at 100 MB/s AllReduce-SGD is first in
    # seed 0 (0.3 s against 0.4 s) and DiLoCo in seed 1 (0.35 against 0.5): no method in every seed.
    rows, curves = [], []
    plan = {(1e6, "allreduce"): [5.0, 6.0], (1e6, "diloco"): [1.0, 1.2],
            (1e8, "allreduce"): [0.3, 0.5], (1e8, "diloco"): [0.4, 0.35]}
    for (bw, proto), hits in plan.items():
        for seed, t in enumerate(hits):
            r = run(proto, bw, seed, 0.05, hit=t)
            rows.append(r)
            curves += curve(r, [(0.0, 0.9), (t - 0.01, 0.2), (t, 0.08), (t + 1, 0.05)])
    text = bandwidth_finding(rows, curves, target=0.1)
    assert text is not None
    assert "at 1 MB/s (8 Mb/s) DiLoCo (1–1.2 s to 10.0 %, the target; AllReduce-SGD next by its mean, 5–6 s)" in text
    assert "at 100 MB/s (800 Mb/s) no method is first to 10.0 % (the target) in every seed" in text
    assert "in every one of 2 seeds" in text
    assert text in findings(rows, curves, target=0.1)


def test_a_lead_shorter_than_the_others_evaluation_spacing_is_no_lead() -> None:
    # hand truth: DiLoCo reaches 0.1 at 1.055 s, local SGD at 1.06 s, whose evaluation before was at
    # 0.8 s (still at 0.2): local SGD may have crossed anywhere in (0.8, 1.06], so DiLoCo is not first
    # in that seed; with local SGD still at 0.2 at 1.06 s (its next evaluation at 1.3), DiLoCo is first
    def finding(still_above_at: float, reach: float) -> str:
        rows, curves = [], []
        for bw in (1e6, 1e8):
            for seed in (0, 1):
                d = run("diloco", bw, seed, 0.05, hit=1.055)
                loc = run("local_sgd", bw, seed, 0.05, hit=reach)
                rows += [d, loc]
                curves += curve(d, [(0.0, 0.9), (1.0, 0.2), (1.055, 0.08)])
                curves += curve(loc, [(0.0, 0.9), (still_above_at, 0.2), (reach, 0.08)])
        text = bandwidth_finding(rows, curves, target=0.1)
        assert text is not None
        return text

    tie, lead = finding(0.8, 1.06), finding(1.06, 1.3)
    assert "at 1 MB/s (8 Mb/s) no method is first to 10.0 % (the target) in every seed by more than" in tie
    assert "at 1 MB/s (8 Mb/s) DiLoCo (1.05 s to 10.0 %, the target; local SGD next by its mean, 1.3 s)" in lead


def test_bandwidth_finding_never_crowns_a_method_that_did_not_learn_or_never_reached() -> None:
    # PowerSGD runs that never reach the target are never first; one that did not learn is named
    rows, curves = [], []
    for bw in (1e6, 1e7):
        for seed in (0, 1):
            a = run("allreduce", bw, seed, 0.05, hit=2.0)
            b = run("allreduce", bw, seed, 0.5, comp="powersgd")
            c = run("local_sgd", bw, seed, 0.9)
            c["did_not_learn"] = True
            rows += [a, b, c]
            curves += curve(a, [(0.0, 0.9), (2.0, 0.08)]) + curve(b, [(0.0, 0.9), (0.1, 0.5)]) \
                + curve(c, [(0.0, 0.9)])
    text = bandwidth_finding(rows, curves, target=0.1)
    assert text is not None and text.count("AllReduce-SGD (2 s to 10.0 %, the target") == 2
    assert text.count("no other method reaches it in every seed") == 2
    assert text.count("local SGD did not learn in every seed") == 2


def test_bandwidth_finding_needs_two_bandwidths_and_one_configuration_per_method() -> None:
    rows = [run("allreduce", 1e6, 0, 0.05, hit=1.0), run("diloco", 1e6, 0, 0.05, hit=0.5)]
    assert bandwidth_finding(rows, [], target=0.1) is None  # one bandwidth
    lr = [dict(r, **{"optimizer.lr": lr}) for r in rows + [run("allreduce", 1e7, 0, 0.05, hit=1.0),
                                                             run("diloco", 1e7, 0, 0.05, hit=0.5)]
          for lr in (0.1, 0.01)]
    assert bandwidth_finding(lr, [], target=0.1) is None  # two configurations of one method per cell


def test_bundled_scenario_axes() -> None:
    # the scenario's promise: AllReduce-SGD / local SGD / DiLoCo × plain / PowerSGD × bandwidth × λ, 3 seeds
    points = load(resolve_scenario("low-communication")).points()
    axes = {(p["protocol"]["name"], p["protocol"]["compression"], p["cluster"]["network"]["bandwidth_Bps"],
             p["cluster"]["learners"]) for p in points}
    assert axes == {(m, c, bw, lam) for m in ("allreduce", "local_sgd", "diloco") for c in ("none", "powersgd")
                    for bw in (1e6, 1e7, 1e8) for lam in (4, 8)}
    assert sorted(p["seed"] for p in points) == sorted([0, 1, 2] * 36)
    assert {p["protocol"]["local_steps"] for p in points} == {8}
    assert {p["protocol"]["powersgd_rank"] for p in points if p["protocol"]["compression"] == "powersgd"} == {2}


TINY = """
name = "lowcomm-tiny"
seed = 0
[workload]
dataset = "digits"
model = "mlp"
epochs = 2
target_error = 0.3
[optimizer]
name = "adamw"
lr = 0.003
[cluster]
learners = 4
minibatch = 16
[cluster.network]
latency_s = 5e-5
bandwidth_Bps = 1e6
[protocol]
name = "allreduce"
local_steps = 4
[sweep]
"cluster.network.bandwidth_Bps" = [1e6, 1e8]
"protocol.name" = ["allreduce", "local_sgd", "diloco"]
"protocol.compression" = ["none", "powersgd"]
"""


def test_advise_over_low_communication_points_recommends_what_a_full_replay_finds_first(tmp_path: Path) -> None:
    # truth: every point replayed whole; advise (successive halving over the same stored
    # replays) recommends the point that reaches the target first
    import torch

    torch.set_num_threads(1)
    records = run_sweep(load_text(TINY), tmp_path / "replay", backend="replay", options={"device": "cpu"},
                        jobs=1, progress=False)
    assert all(r["row"]["error"] is None for r in records)
    times = {r["row"]["run_id"]: next((c["sim_time_s"] for c in sorted(r["curves"], key=lambda c: c["sim_time_s"])
                                       if c["test_error"] <= 0.3), None) for r in records}
    reached = {k: t for k, t in times.items() if t is not None}
    assert reached
    adv = A.advise(load_text(TINY), tmp_path, jobs=1, resume=True, options={"device": "cpu"}, target_error=0.3)
    assert adv.recommendation is not None
    assert adv.recommendation.at_s == pytest.approx(min(reached.values()))


PROXY = """
name = "diloco-proxy"
seed = 0
replicates = 3
[workload]
dataset = "digits"
model = "mlp"
epochs = 10
target_error = 0.06
[optimizer]
name = "adamw"
lr = 0.003
[cluster]
learners = 8
minibatch = 16
[protocol]
name = "allreduce"
local_steps = 8
[sweep]
"protocol.name" = ["allreduce", "local_sgd", "diloco"]
"""


def test_published_claims_on_a_small_proxy_over_three_seeds(tmp_path: Path) -> None:
    # truth: Douillard et al. 2023 (DiLoCo, 8 workers): "matches synchronous training while
    # communicating H× less"; local SGD at a moderate H learns nearly as well (Lin et al. 2020,
    # "Don't use large mini-batches, use local SGD"). On digits (360 test samples, one sample
    # 0.28 points), 8 workers, H = 8, AdamW inner steps, 3 seeds: DiLoCo's mean final error within
    # 1 point of AllReduce-SGD's, local SGD's within 3, each far from chance in every seed; both
    # send AllReduce-SGD's bytes once every H iterations.
    import torch

    torch.set_num_threads(1)
    records = run_sweep(load_text(PROXY), tmp_path / "r", backend="replay", options={"device": "cpu"},
                        jobs=1, progress=False)
    by: dict[str, list[dict]] = {}
    for r in records:
        assert r["row"]["error"] is None
        by.setdefault(r["row"]["protocol"], []).append(r["row"])
    assert {k: len(v) for k, v in by.items()} == {"allreduce": 3, "local_sgd": 3, "diloco": 3}

    def mean(proto: str) -> float:
        return sum(r["final_test_error"] for r in by[proto]) / 3

    assert abs(mean("diloco") - mean("allreduce")) <= 0.01
    assert mean("local_sgd") - mean("allreduce") <= 0.03
    assert all(r["final_test_error"] < 0.15 for rows in by.values() for r in rows)
    # one model's bytes per averaging, one averaging every H = 8 iterations (the last round may be
    # partial: ⌈K/H⌉ averagings in K iterations)
    ar = by["allreduce"][0]["bytes_sent_per_node_per_iter"]
    for proto in ("diloco", "local_sgd"):
        row = by[proto][0]
        k = row["iterations"]
        assert row["bytes_sent_per_node_per_iter"] * k == pytest.approx(ar * -(-k // 8), rel=1e-9)
