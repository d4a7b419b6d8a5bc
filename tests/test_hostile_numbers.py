"""Hostile numbers and sizes in scenarios, ``--set`` and compute profiles: every one is refused
before any work with one line naming the file or option, the key and its range, exit status 2,
nothing written; the size estimates are checked against what the simulator really does."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path

import pytest

from ddlsim.scenarios import load as loadmod
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.cli.common import NAME_MAX_BYTES, safe_name
from ddlsim.scenarios.cli.cost import estimate
from ddlsim.scenarios.load import load, load_text

TINY = """
name = "tiny"
[workload]
epochs = 1
[cluster]
learners = 2
minibatch = 64
[protocol]
name = "async"
"""
BIG = 2**1330                      # beyond every float: float(BIG) raises OverflowError
LONG = "9" * 5000                  # beyond the 4,300 digits Python converts from text


def refused(capsys: pytest.CaptureFixture, args: list[str], *needles: str, out: Path | None = None) -> str:
    """Run the CLI; it must exit 2 with one ``ddlsim: error:`` line holding every needle, no
    traceback, and leave ``out`` unwritten."""
    rc = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("ddlsim: error: "), err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    if out is not None:
        assert not out.exists()
    return err[0]


STALLS = TINY + """
[cluster.compute]
distribution = "deterministic"
base_s = 0.01
per_sample_s = 0.0
[cluster.network]
latency_s = 0.0
bandwidth_Bps = inf
[cluster.server]
apply_s = 0.0
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    f = tmp_path / "tiny.toml"
    f.write_text(TINY)
    return f


@pytest.mark.parametrize("setting, needles", [
    (f"cluster.learners={BIG}", ["key 'cluster.learners' = 2.34e+400", "≤ 100000"]),
    (f"workload.epochs={BIG}", ["key 'workload.epochs' = 2.34e+400", "≤ 1e+06"]),
    (f"optimizer.milestones=[[{BIG}, 0.5]]", ["key 'optimizer.milestones'", "epoch of a milestone", "≤ 1e+06"]),
    (f"seed={BIG}", ["key 'seed' = 2.34e+400", "≤ 9.22337e+18"]),
    (f"cluster.learners=[2, {BIG}]", ["key 'cluster.learners' = 2.34e+400", "≤ 100000"]),
    (f"cluster.network.bandwidth_Bps={BIG}", ["key 'cluster.network.bandwidth_Bps'", "too large"]),
    (f"cluster.learners={LONG}", ["key 'cluster.learners' = an integer of more than 4,300 digits", "≤ 100000"]),
    (f"workload.epochs=-{LONG}", ["key 'workload.epochs' = an integer of more than 4,300 digits", "> 0"]),
    (f"sweep.seed=[1, {LONG}]", ["key 'seed' = an integer of more than 4,300 digits", "≥ 0"]),
    ("cluster.network.bytes_per_param=0", ["key 'cluster.network.bytes_per_param' = 0.0", "must be > 0"]),
])
def test_a_hostile_number_in_a_set_is_refused_with_its_key_and_range(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture, setting: str, needles: list[str]) -> None:
    out = tmp_path / "out"
    refused(capsys, ["simulate", str(tiny), "--out", str(out), "--set", setting], "--set", *needles, out=out)


@pytest.mark.parametrize("text, needles", [
    (f"[workload]\nepochs = {LONG}\n", ["key 'workload.epochs' = an integer of more than 4,300 digits"]),
    (f'[sweep]\n"cluster.minibatch" = [4, {LONG}]\n', ["[sweep] 'cluster.minibatch'", "more than 4,300 digits",
                                                         "≤ 1e+07"]),
    (f"[cluster]\nlearners = {BIG}\n", ["key 'cluster.learners' = 2.34e+400"]),
    (f"[optimizer]\nmilestones = [[1, {BIG}]]\n", ["factor of a milestone", "≤ 1e+30"]),
    ("[cluster.network]\nbytes_per_param = 0\n", ["key 'cluster.network.bytes_per_param' = 0.0"]),
])
def test_a_hostile_number_in_a_file_is_refused_naming_the_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture, text: str, needles: list[str]) -> None:
    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(text)
    refused(capsys, ["simulate", str(f), "--out", str(out)], f"{f}:", *needles, out=out)


@pytest.mark.parametrize("value", ["[4,", "[4, 16", "{a = 1", "'unclosed", '"unclosed'])
def test_a_set_value_that_starts_like_toml_must_be_toml(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        value: str) -> None:
    out = tmp_path / "out"
    refused(capsys, ["simulate", str(tiny), "--out", str(out), "--set", f"cluster.minibatch={value}"],
            "--set cluster.minibatch: malformed TOML value", out=out)


# -- compute profiles -----------------------------------------------------------------------------
@pytest.mark.parametrize("profile, needles", [
    # extrapolated to μ = 64 from (1, 1 s) and (2, 1.7e308 s) the mean would be inf, the simulated time nan
    ("minibatch = [1, 2]\nseconds = [1.0, 1.7e308]\n", ["key 'seconds' = 1.7e+308", "≤ 1e+06"]),
    (f"minibatch = [1, {2**70}]\nseconds = [1.0, 2.0]\n", ["key 'minibatch' = 1.18e+21", "≤ 1e+07"]),
    ("minibatch = [1, 2]\nseconds = [1.0, nan]\n", ["key 'seconds' = nan"]),
    (f"minibatch = [1, {LONG}]\nseconds = [1.0, 2.0]\n", ["an integer of more than 4,300 digits"]),
])
def test_a_profile_beyond_its_ranges_is_refused_when_read(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                         profile: str, needles: list[str]) -> None:
    (tmp_path / "prof.toml").write_text(profile)
    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(TINY + '[cluster.compute]\nprofile = "prof.toml"\n')
    refused(capsys, ["simulate", str(f), "--out", str(out)], "key 'cluster.compute.profile'", "prof.toml",
            *needles, out=out)


def test_a_profile_at_its_bounds_extrapolates_to_a_finite_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # the steepest table the bounds allow, (1, 1e-300 s) → (2, 1e6 s), extrapolated to μ = 64:
    # 1e-300 + (1e6 − 1e-300) · 63 = 6.3e7 s per minibatch, finite; the run's time is that × its minibatches
    (tmp_path / "prof.toml").write_text("minibatch = [1, 2]\nseconds = [1e-300, 1e6]\n")
    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(STALLS.replace("epochs = 1", "epochs = 1\nsamples_per_epoch = 128")
                 .replace("base_s = 0.01", 'profile = "prof.toml"'))
    assert main(["simulate", str(f), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    (row,) = list(csv.DictReader(open(out / "summary.csv")))
    # 2 learners, 128 samples of μ = 64: one minibatch each, in parallel
    assert float(row["sim_time_s"]) == pytest.approx(1e6 * 63, rel=1e-12)


def test_a_nul_byte_in_a_profile_path_is_refused_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(TINY + '[cluster.compute]\nprofile = "prof\\u0000.toml"\n')
    refused(capsys, ["simulate", str(f), "--out", str(out)], f"{f}:", "key 'cluster.compute.profile'",
            "NUL byte", out=out)


TABLE = "minibatch = [1, 8]\nseconds = [0.01, 0.05]\n"


@pytest.mark.parametrize("text, needle", [
    (TABLE + "[server]\napply_s = nan\n", "apply_s = nan"),
    (TABLE + "[network]\nlatency_s = -1e-5\n", "latency_s = -1e-05"),
    (TABLE + "[network]\nbandwidth_Bps = 0\n", "bandwidth_Bps = 0"),
    (TABLE + f"[server]\napply_s = {LONG}\n", "an integer of more than 4,300 digits"),
    ("minibatch = [1, 8]\nseconds = [0.01, 1e300]\n", "key 'seconds' = 1e+300"),  # the table the simulation reads
    ("", "holds no figure a validation uses"),                 # an empty file is no profile
    ("[network]\nlatencyy_s = 1e-4\n", "holds no figure a validation uses"),
])
def test_validate_refuses_a_bad_calibrated_profile_before_any_live_run(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, text: str,
        needle: str) -> None:
    import ddlsim.scenarios.validate as validate

    def no_live_run(*args: object, **kw: object) -> None:
        raise AssertionError("a live run started before the profile was checked")

    monkeypatch.setattr(validate, "validate_point", no_live_run)
    bad, out = tmp_path / "bad.toml", tmp_path / "out"
    bad.write_text(text)
    refused(capsys, ["validate", "validate-grid", "--profile", str(bad), "--out", str(out), "--device", "cpu"],
            "bad.toml", needle, out=out)


# -- size limits ----------------------------------------------------------------------------------


def test_stalls_stretch_compute_by_e_to_the_load_as_the_estimate_says(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    # Stalls (Poisson rate r, Exp lengths of mean m) overlap: their union is an M/M/∞ busy period,
    # free e^-ρ of the time (ρ = r·m), so W seconds of computing take W·e^ρ. One learner, 200
    # minibatches of 10 ms, nothing else: W = 2 s, and at ρ = 1 the run takes 2e ≈ 5.44 s.
    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(STALLS.replace("learners = 2", "learners = 1")
                 .replace("epochs = 1", "epochs = 1\nsamples_per_epoch = 12800")
                 + "[cluster.stragglers]\nstall_rate_per_s = 1000.0\nstall_mean_s = 0.001\n")
    assert main(["simulate", str(f), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    (row,) = list(csv.DictReader(open(out / "summary.csv")))
    assert float(row["sim_time_s"]) == pytest.approx(2 * math.e, rel=0.1)
    cost = estimate(load(f).points()[0])
    assert cost.sim_time_s == pytest.approx(2 * math.e, rel=1e-9)
    assert cost.stalls == pytest.approx(1000 * 2 * math.e, rel=1e-9)


def test_a_stall_load_at_the_old_limit_is_refused_before_any_work(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    # ρ = 1e5/s × 1 ms = 100 (the old limit): learners free e^-100 of the time; 8 gradients of 10 ms
    # would need ≈ 0.08 · e^100 s of simulated time, ≈ 2e46 stall events. (It ran past 600 s.)
    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(STALLS.replace("epochs = 1", "epochs = 1\nsamples_per_epoch = 512")
                 + "[cluster.stragglers]\nstall_rate_per_s = 1e5\nstall_mean_s = 1e-3\n")
    line = refused(capsys, ["simulate", str(f), "--out", str(out)], "stall_rate_per_s × stall_mean_s = 100",
                   "stalled all but e^-100", "--force", out=out)
    events = float(line.split("≥ ")[2].split(" stall events")[0])
    assert events == pytest.approx(1e5 * 8 * 0.01 * math.exp(100), rel=1e-2)


@pytest.mark.parametrize("protocol, topology, n, peers, per_iteration", [
    ("dpsgd", "complete", 6, 1, 6 * 5),       # every other node
    ("dpsgd", "ring", 6, 1, 6 * 2),           # both ring neighbours
    ("sgp", "complete", 6, 1, 6 * 6),         # every other node and its own share
    ("sgp", "npdde", 6, 1, 6 * 2),            # one out-peer and its own share
    ("adpsgd", "complete", 6, 1, 6),          # each active node's request and its partner's answer
])
def test_the_mixing_estimate_is_the_trace_s_mixes(tmp_path: Path, capsys: pytest.CaptureFixture, protocol: str,
                                                  topology: str, n: int, peers: int, per_iteration: int) -> None:
    from ddlsim.simulator import trace as tracemod

    f, out = tmp_path / "s.toml", tmp_path / "out"
    f.write_text(TINY.replace('"async"', f'"{protocol}"\ntopology = "{topology}"\npeers = {peers}')
                 .replace("learners = 2", f"learners = {n}").replace("minibatch = 64", "minibatch = 4")
                 .replace("epochs = 1", "epochs = 1\nsamples_per_epoch = 120"))
    assert main(["simulate", str(f), "--out", str(out), "--quiet", "--traces"]) == 0
    capsys.readouterr()
    (trace_file,) = (out / "runs").glob("*/trace.ddlt")
    t = tracemod.read(trace_file)
    mixes = int((t.ops["kind"] == tracemod.KIND_NAMES.index("mix")).sum())
    iterations = math.ceil(120 / (n * 4))  # 5
    assert mixes == per_iteration * iterations
    assert estimate(load(f).points()[0]).messages == mixes


@pytest.mark.parametrize("protocol, extra, messages", [
    ("local_sgd", "local_steps = 4", 4 * 2),    # K = ⌈120/(4·4)⌉ = 8 local steps: 2 averagings, one message a node
    ("local_sgd", "local_steps = 4\nwarmup_steps = 2", 4 * (2 * 3 + 2)),  # 2 all-reduce steps of 3 buckets; 6 local
    ("diloco", "local_steps = 8", 4 * 1),       # one outer step at the end
])
def test_local_protocols_estimate_their_averagings_not_a_message_a_step(tmp_path: Path, protocol: str, extra: str,
                                                                        messages: int) -> None:
    # truth: hand counts; the digits MLP's 4 B parameters in buckets of a third of them
    from ddlsim.simulator.catalog import dataset_info, param_count

    f = tmp_path / "s.toml"
    bucket = math.ceil(param_count("mlp", dataset_info("digits")) * 4 / 3)
    f.write_text(TINY.replace('"async"', f'"{protocol}"\n{extra}\nbucket_bytes = {bucket}')
                 .replace("learners = 2", "learners = 4").replace("minibatch = 64", "minibatch = 4")
                 .replace("epochs = 1", "epochs = 1\nsamples_per_epoch = 120"))
    assert estimate(load(f).points()[0]).messages == messages


def test_d_psgd_on_a_complete_graph_of_100000_nodes_is_refused(tiny: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    # 100,000 × 99,999 mixes per iteration: ≈ 1e10 peer-table entries before the first iteration
    refused(capsys, ["simulate", str(tiny), "--out", str(out), "--set", "protocol.name=dpsgd",
                     "--set", "protocol.topology=complete", "--set", "cluster.learners=100000",
                     "--set", "workload.samples_per_epoch=100000", "--set", "cluster.minibatch=1"],
            "1e+10 table entries", "9,999,900,000 links per iteration of the 'complete' graph", "--force", out=out)


def test_tiny_buckets_count_as_messages(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # ResNet-50 (25,557,032 parameters × 4 B) in buckets of 1 byte: 102,228,128 messages per gradient
    out = tmp_path / "out"
    refused(capsys, ["simulate", str(tiny), "--out", str(out), "--set", "protocol.bucket_bytes=1",
                     "--set", "workload.model=resnet50", "--set", "workload.dataset=imagenet",
                     "--set", "workload.samples_per_epoch=64"],
            "1 gradients × 102,228,128 buckets of protocol.bucket_bytes", out=out)


def test_a_point_whose_result_would_exceed_the_read_bound_is_refused(tiny: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    from ddlsim.scenarios.runner import RESULT_MAX_BYTES

    # 7000 epochs of 1437 digits at μ = 8: 1,257,375 async updates, each evaluated (1000 per epoch)
    out = tmp_path / "out"
    args = ["--set", "workload.epochs=7000", "--set", "workload.evals_per_epoch=1000", "--set", "cluster.minibatch=8"]
    refused(capsys, ["simulate", str(tiny), "--out", str(out), *args], "1,257,376 evaluations",
            f"more than the {RESULT_MAX_BYTES >> 20} MiB --resume reads back", "--force", out=out)


def test_the_evaluation_estimate_is_the_result_s(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import json

    out = tmp_path / "out"
    args = ["--set", "workload.evals_per_epoch=50", "--set", "workload.epochs=2",
            "--set", 'protocol.name=["async", "hardsync", "sgp"]', "--set", "cluster.learners=4"]
    assert main(["simulate", str(tiny), "--out", str(out), "--quiet", *args]) == 0
    capsys.readouterr()
    # 2 × 1437 samples: async 45 updates of 64, hardsync 12 of 4 × 64, sgp 4 nodes × 12 iterations;
    # one evaluation per update (100 marks are more), and one at t = 0
    expected = {"async": 46, "hardsync": 13, "sgp": 49}
    for p in load(tiny, args[1::2]).points():
        record = json.loads((out / "runs" / p["_id"] / "result.json").read_text())
        assert len(record["evals"]) == estimate(p).evaluations == expected[p["protocol"]["name"]]


def test_a_sweep_above_the_point_limit_is_refused_before_its_values_are_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_axis(*args: object) -> None:
        raise AssertionError("a value was checked before the points were counted")

    monkeypatch.setattr(loadmod, "_axis", no_axis)
    f = tmp_path / "s.toml"
    f.write_text('[sweep]\n"seed" = [' + ", ".join(map(str, range(100_001))) + "]\n")
    refused(capsys, ["simulate", str(f), "--out", str(tmp_path / "out")], "the sweep has 100,001 points",
            "more than 100,000", out=tmp_path / "out")


def test_a_long_axis_finds_its_duplicate() -> None:
    values = list(range(50_000)) + [0]
    with pytest.raises(loadmod.ScenarioError, match="key 'seed' lists 0 twice"):
        load_text('[sweep]\n"seed" = [' + ", ".join(map(str, values)) + "]\n", "s.toml")
    with pytest.raises(loadmod.ScenarioError, match="lists \\[\\[1.0, 0.5\\]\\] twice"):  # 1 and 1.0 are one epoch
        load_text('[sweep]\n"optimizer.milestones" = [[[1, 0.5]], [[2, 0.5]], [[1.0, 0.5]]]\n', "s.toml")


# -- names of output folders ----------------------------------------------------------------------
def test_a_long_cjk_name_is_a_folder_name_of_at_most_255_bytes(tmp_path: Path) -> None:
    name = "分布式训练的模拟" * 40  # 320 characters, 960 bytes of UTF-8
    clean = safe_name(name)
    encoded = clean.encode(sys.getfilesystemencoding())
    assert len(encoded) <= NAME_MAX_BYTES and len((clean + "-validate").encode()) <= 255
    assert name.startswith(clean) and len(clean) == NAME_MAX_BYTES // 3  # cut at a character, readable
    (tmp_path / (clean + "-advise")).mkdir()  # the file system takes it


def test_the_default_out_of_a_long_cjk_scenario_is_created(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # the folder is named after the scenario (its name, or its file's name): both are long CJK here,
    # the file's 83 characters (249 bytes, with ".toml" the longest such file name there is), the
    # name's 200 (600 bytes: uncut, "File name too long")
    stem, name = "训" * 83, "训练" * 100
    f = tmp_path / f"{stem}.toml"
    f.write_text(TINY.replace('name = "tiny"', f'name = "{name}"'))
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", str(f), "--quiet"]) == 0
    capsys.readouterr()
    (folder,) = (tmp_path / "results").iterdir()
    assert (folder / "summary.csv").is_file()
    assert folder.name in (safe_name(stem), safe_name(name)) and len(os.fsencode(folder.name)) <= NAME_MAX_BYTES
    assert stem.startswith(folder.name) or name.startswith(folder.name)
