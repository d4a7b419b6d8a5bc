"""Network profiles: α and β back from nccl-tests logs of known α and β, a real log, the
refusals, a scenario that names the profile simulating its closed form, and a gloo measurement.

Truths: the logs are synthesised here from the ring closed forms written here (all-reduce
``2(n−1)α + 2(n−1)/n·S/β``, all-gather ``(n−1)α + (n−1)/n·S/β``) with nccl-tests' bus bandwidth
(doc/PERFORMANCE.md: busbw = algbw·2(n−1)/n, (n−1)/n), printed in its format; the real log is
an H100 run's (2 nodes × 8 GPUs) as published in github.com/lessizzmore/create-a3mega-ztan-fork
(file ztan-NCCL-test-result), whose facts (16 ranks, 2 hosts, busbw/algbw = 1.875) are read off
its text by hand.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from ddlsim.scenarios.cli import main
from ddlsim.scenarios.hardware import catalogue
from ddlsim.scenarios.load import load
from ddlsim.scenarios.schema import ScenarioError
from ddlsim.simulator.network_profile import fit_alpha_beta, load_network_profile, read_nccl_tests
from ddlsim.simulator.run import simulate

DATA = Path(__file__).parent / "data"
REAL_LOG = DATA / "nccl_tests_all_reduce_h100_2x8.txt"
SIZES = [2 ** k for k in range(10, 31, 2)]  # 1 KiB … 1 GiB
# a catalogued network with a software cost, which the profile's overhead_s = 0 replaces
PRESET = max(catalogue()["network"], key=lambda k: catalogue()["network"][k]["overhead_s"])


def closed_form(collective: str, n: int, alpha: float, beta: float, s: float) -> float:
    steps, volume = (2, 2) if collective == "all_reduce" else (1, 1)
    return steps * (n - 1) * alpha + volume * (n - 1) / n * s / beta


def synth_log(alpha: float, beta: float, n: int, collective: str = "all_reduce", *, in_place: bool = True,
              hosts: int = 1, rank_lines: bool = True, root: bool = True, sizes: list[int] | None = None,
              times_us: dict[int, str] | None = None) -> str:
    """An nccl-tests log in its real format with the times of the closed form (µs, 2 decimals)."""
    factor = (2 if collective == "all_reduce" else 1) * (n - 1) / n
    redop = "sum" if collective == "all_reduce" else "none"
    per_host = n // hosts
    lines = [f"# nThread 1 nGpus {per_host if hosts == 1 else 1} minBytes 1024 maxBytes 1073741824 step: 4(factor) "
             "warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    if rank_lines:
        lines += [f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {f'node{r // per_host}':>10} device {r % per_host:2d} "
                  f"[0x{r:02x}] NVIDIA A100-SXM4-80GB" for r in range(n)]
    lines.append("#")
    cols = ["size", "count", "type", "redop"] + (["root"] if root else [])
    one = ["time", "algbw", "busbw", "#wrong"]
    lines.append("#" + " " * 62 + "out-of-place" + (" " * 23 + "in-place" if in_place else ""))
    lines.append("# " + "  ".join(f"{c:>9}" for c in cols + one + (one if in_place else [])))
    units = ["(B)", "(elements)", "", ""] + ([""] if root else []) + ["(us)", "(GB/s)", "(GB/s)", ""]
    lines.append("# " + "  ".join(f"{c:>9}" for c in units + (units[-4:] if in_place else [])))
    for s in sizes or SIZES:
        t = closed_form(collective, n, alpha, beta, s)
        shown = (times_us or {}).get(s, f"{t * 1e6:.2f}")
        alg = s / t / 1e9
        part = [shown, f"{alg:.2f}", f"{alg * factor:.2f}", "0"]
        row = [str(s), str(s // 4), "float", redop] + (["-1"] if root else []) + part + (part if in_place else [])
        lines.append("  " + "  ".join(f"{c:>9}" for c in row))
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.2345 ", "#", ""]
    return "\n".join(lines)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("in_place,root", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("n,alpha,beta", [(8, 20e-6, 1.0e10), (2, 3e-6, 4.5e10), (16, 7e-6, 2.2e11)])
def test_alpha_and_beta_come_back_from_a_log_of_known_alpha_and_beta(tmp_path: Path, collective: str, in_place: bool,
                                                                     root: bool, n: int, alpha: float,
                                                                     beta: float) -> None:
    path = tmp_path / "ar.log"
    path.write_text(synth_log(alpha, beta, n, collective, in_place=in_place, root=root))
    log = read_nccl_tests(path)
    assert (log.ranks, log.hosts, log.collective) == (n, 1, collective)  # collective told by busbw/algbw alone
    assert len(log.timings) == len(SIZES) * (2 if in_place else 1)
    out = tmp_path / "net.toml"
    assert main(["calibrate", "--nccl-tests", str(path), "--out", str(out)]) == 0
    prof = tomllib.loads(out.read_text())
    assert prof["fit"]["alpha_s"] == pytest.approx(alpha, rel=1e-3)
    assert prof["fit"]["beta_Bps"] == pytest.approx(beta, rel=1e-3)
    # one host: the GPUs of one machine, the intra-node link; the residuals are the print's rounding
    assert load_network_profile(out) == {"intra_latency_s": prof["fit"]["alpha_s"],
                                         "intra_bandwidth_Bps": prof["fit"]["beta_Bps"]}
    assert prof["fit"]["max_relative_residual"] < 2 * 0.005e-6 / closed_form(collective, n, alpha, beta, SIZES[0])


def test_several_hosts_set_the_inter_node_link_and_the_output_says_alpha_and_beta(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "two-nodes.log"
    path.write_text(synth_log(12e-6, 2.4e10, 16, hosts=2))
    out = tmp_path / "net.toml"
    assert main(["calibrate", "--nccl-tests", str(path), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "α = 12.000 µs per step, β = 24 GB/s" in said and str(out) in said
    assert 'a scenario of 2 nodes × 8 GPUs charges it with protocol.allreduce_algorithm = "ring"' in said
    net = load_network_profile(out)
    assert set(net) == {"latency_s", "bandwidth_Bps", "overhead_s"} and net["overhead_s"] == 0.0
    assert net["latency_s"] == pytest.approx(12e-6, rel=1e-3)
    assert net["bandwidth_Bps"] == pytest.approx(2.4e10, rel=1e-3)
    # its own profile is rewritten without --force
    assert main(["calibrate", "--nccl-tests", str(path), "--out", str(out), "--scope", "intra"]) == 0
    assert set(load_network_profile(out)) == {"intra_latency_s", "intra_bandwidth_Bps"}


def test_a_real_all_reduce_log_is_read_and_fitted_to_its_least_squares_optimum() -> None:
    log = read_nccl_tests(REAL_LOG)
    # by hand from the text: ranks 0–15 on two host names, busbw/algbw = 338.82/180.71 = 1.875 = 2·15/16
    assert (log.ranks, log.hosts, log.collective) == (16, 2, "all_reduce")
    assert len(log.timings) == 31 * 2 and log.timings[0].seconds == pytest.approx(135.8e-6)
    assert log.timings[-1].nbytes == 8589934592 and log.timings[-1].seconds == pytest.approx(47743e-6)
    fit = fit_alpha_beta("all_reduce", 16, [t.nbytes for t in log.timings], [t.seconds for t in log.timings])
    # independent bounds: the smallest rows are ≈ 30 steps of α (123 µs / 30 ≈ 4.1 µs); β under
    # the busbw the largest row shows (338.82 GB/s) since that row also pays 30 α
    assert 2e-6 < fit.alpha_s < 8e-6 and 1e11 < fit.beta_Bps < 3.39e11

    def loss(a: float, b: float) -> float:  # the relative least squares, written here
        return sum(((30 * a + 1.875 * t.nbytes / b) / t.seconds - 1) ** 2 for t in log.timings)

    best = loss(fit.alpha_s, fit.beta_Bps)
    assert math.sqrt(best / len(log.timings)) == pytest.approx(fit.rms_residual, rel=1e-9)
    for da, db in ((1.01, 1), (0.99, 1), (1, 1.01), (1, 0.99)):
        assert loss(fit.alpha_s * da, fit.beta_Bps * db) > best


def _refused(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddlsim: error: ") and "Traceback" not in err
    return err


def test_bad_logs_are_one_line_naming_the_file_and_the_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "net.toml"
    good = synth_log(20e-6, 1e10, 8)
    lines = good.splitlines()
    first_row = next(i for i, line in enumerate(lines) if line.strip().startswith("1024 "))

    def case(name: str, text: str, *extra: str) -> str:
        p = tmp_path / name
        p.write_text(text)
        return _refused(capsys, ["calibrate", "--nccl-tests", str(p), "--out", str(out), *extra])

    err = case("scenario.toml", 'name = "x"\n[cluster]\nlearners = 4\n')
    assert "scenario.toml: not an nccl-tests log" in err
    swapped = lines[:]
    swapped[first_row + 2], swapped[first_row + 3] = swapped[first_row + 3], swapped[first_row + 2]
    err = case("swap.log", "\n".join(swapped))
    assert f"swap.log: line {first_row + 4}: size 16384 after 65536" in err and "must increase" in err
    for bad in ("-5.00", "0.00"):
        err = case("neg.log", synth_log(20e-6, 1e10, 8, times_us={4096: bad}))
        assert f"neg.log: line {first_row + 2}: time = '{bad}': must be > 0" in err
    no_ranks = "\n".join(line for line in lines if "Rank" not in line)
    err = case("noranks.log", no_ranks)
    assert "noranks.log: no '#  Rank" in err and "--ranks N" in err and "nThread 1 nGpus 8" in err
    err = case("ranks.log", good, "--ranks", "4")
    assert "--ranks 4, but the log's '#  Rank' lines name 8 ranks" in err
    cut = lines[:]
    cut[first_row + 1] = cut[first_row + 1].rsplit(None, 2)[0]
    err = case("cut.log", "\n".join(cut))
    assert f"cut.log: line {first_row + 2}: 11 fields where the column header" in err
    one_gpu = "\n".join(line for line in lines if "Rank" not in line or "Rank  0 " in line)
    assert "one.log: 1 rank: a collective of one GPU moves nothing" in case("one.log", one_gpu)
    err = case("gather.log", good, "--collective", "all_gather")  # busbw/algbw is all-reduce's 1.75
    assert "is not all_gather's 0.875 for 8 ranks" in err
    # a time unit nccl-tests does not print is refused, not read as µs
    units = next(i for i, line in enumerate(lines) if "(elements)" in line)
    for unit in ("(s)", "(ns)", "(sec)"):
        err = case("unit.log", "\n".join(lines[:units] + [lines[units].replace("(us)", unit)] + lines[units + 1:]))
        assert f"unit.log: line {units + 1}: unit {unit} is not one nccl-tests prints" in err
    # times no collective takes: under a nanosecond, over an hour (no fit is attempted)
    for bad in ("1e-300", "1e+308"):
        err = case("odd.log", synth_log(20e-6, 1e10, 8, times_us={4096: bad}))
        assert f"odd.log: line {first_row + 2}: time = '{bad}'" in err and "not one collective's time" in err
    # equal times at every size: no bandwidth to fit (the latency alone explains them)
    flat = case("flat.log", synth_log(20e-6, 1e10, 8, times_us={s: "100.00" for s in SIZES}))
    assert "flat.log: the times do not grow with the message size" in flat
    # times that fall as the messages grow: no collective's (the fit would give β of 10⁴ GB/s)
    falling = {s: f"{1000.0 - 50 * i:.2f}" for i, s in enumerate(SIZES)}
    err = case("falling.log", synth_log(20e-6, 1e10, 8, times_us=falling))
    assert "falling.log: the times do not grow with the message size: 1073741824 B on line" in err
    # a row whose check found wrong results (#wrong, the column after busbw): a broken run
    wrong = lines[:]
    wrong[first_row + 1] = wrong[first_row + 1].rstrip()[:-1] + "3"
    err = case("wrong.log", "\n".join(wrong))
    assert f"wrong.log: line {first_row + 2}: #wrong = '3': the collective returned wrong data" in err
    assert main(["calibrate", "--nccl-tests", str(tmp_path / "noranks.log"), "--out", ""]) == 2
    assert "--out '': an empty path names no file" in capsys.readouterr().err
    assert not out.exists()  # nothing written by a refused command
    # a log without rank lines needs --ranks (and --scope: on how many hosts is unstated)
    p = tmp_path / "noranks.log"
    assert main(["calibrate", "--nccl-tests", str(p), "--out", str(out), "--ranks", "8", "--scope", "inter"]) == 0
    assert load_network_profile(out)["latency_s"] == pytest.approx(20e-6, rel=1e-3)


def test_the_out_file_is_not_overwritten_unless_a_network_profile(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    log = tmp_path / "ar.log"
    log.write_text(synth_log(20e-6, 1e10, 8))
    mine = tmp_path / "notes.toml"
    mine.write_text("my notes\n")
    err = _refused(capsys, ["calibrate", "--nccl-tests", str(log), "--out", str(mine)])
    assert "notes.toml: exists and is not a network profile ddlsim wrote" in err and mine.read_text() == "my notes\n"
    assert main(["calibrate", "--nccl-tests", str(log), "--out", str(mine), "--force"]) == 0
    err = _refused(capsys, ["calibrate", "--ranks", "2"])
    assert "--ranks: only with --nccl-tests LOG or --network" in err
    for argv, said in ((["--network", "--device", ""], "an empty device name"),
                       (["--network", "--ranks", "1"], "--ranks 1: the measurement needs 2 to 64 processes"),
                       (["--network", "--max-bytes", "10"], "--max-bytes 10: must be between 1024 and"),
                       (["--network", "--min-bytes", "64"], "--min-bytes: only with --nccl-tests"),
                       (["--network", "--nccl-tests", str(log)], "--nccl-tests and --network: give one")):
        assert said in _refused(capsys, ["calibrate", *argv, "--out", str(tmp_path / "m.toml")])
    assert not (tmp_path / "m.toml").exists()


def ar_scenario(folder: Path, profile: str, nodes: int, g: int) -> Path:
    text = f"""
seed = 1
[workload]
dataset = "imagenet"
model = "resnet50"
epochs = 1
samples_per_epoch = {256 * nodes * g * 3}
[cluster]
learners = {nodes * g}
minibatch = 256
gpus_per_node = {g}
[cluster.compute]
distribution = "deterministic"
base_s = 0.3
per_sample_s = 0.0
[cluster.network]
profile = "{profile}"
preset = "{PRESET}"
[protocol]
name = "allreduce"
bucket_bytes = 0
"""
    path = folder / "s.toml"
    path.write_text(text)
    return path


def per_iteration(point: dict) -> float:
    r = simulate(point)
    return r.summary["sim_time_s"] / (r.summary["gradients"] / point["cluster"]["learners"])


def test_a_scenario_naming_the_profile_simulates_its_alpha_beta_closed_form(tmp_path: Path) -> None:
    # truth: compute + the ring closed form with the profile's α and β (the preset's overhead
    # replaced by the profile's 0); a relative path resolves against the scenario's folder
    (tmp_path / "logs").mkdir()
    alpha, beta, M = 15e-6, 3.0e9, 25_557_032 * 4
    log = tmp_path / "ar.log"
    log.write_text(synth_log(alpha, beta, 4, hosts=4))
    assert main(["calibrate", "--nccl-tests", str(log), "--out", str(tmp_path / "logs" / "net.toml")]) == 0
    fit = tomllib.loads((tmp_path / "logs" / "net.toml").read_text())["fit"]
    a, b = fit["alpha_s"], fit["beta_Bps"]
    point = load(ar_scenario(tmp_path, "logs/net.toml", 4, 1)).points()[0]
    assert per_iteration(point) == pytest.approx(0.3 + 6 * a + 1.5 * M / b, rel=1e-12)
    # an explicit key wins over the profile
    point = load(ar_scenario(tmp_path, "logs/net.toml", 4, 1), ["cluster.network.latency_s=1e-3"]).points()[0]
    assert per_iteration(point) == pytest.approx(0.3 + 6 * 1e-3 + 1.5 * M / b, rel=1e-12)
    # 2 hosts × 4 GPUs: one ring through the 8 ranks, its slowest edge the fitted link
    log.write_text(synth_log(alpha, beta, 8, hosts=2))
    assert main(["calibrate", "--nccl-tests", str(log), "--out", str(tmp_path / "logs" / "net.toml")]) == 0
    fit = tomllib.loads((tmp_path / "logs" / "net.toml").read_text())["fit"]
    point = load(ar_scenario(tmp_path, "logs/net.toml", 2, 4), ["protocol.allreduce_algorithm=ring"]).points()[0]
    assert per_iteration(point) == pytest.approx(0.3 + 14 * fit["alpha_s"] + 1.75 * M / fit["beta_Bps"], rel=1e-12)
    # one host of 4 GPUs: the intra-node link of a single node's all-reduce
    log.write_text(synth_log(alpha, beta, 4))
    assert main(["calibrate", "--nccl-tests", str(log), "--out", str(tmp_path / "logs" / "net.toml")]) == 0
    fit = tomllib.loads((tmp_path / "logs" / "net.toml").read_text())["fit"]
    point = load(ar_scenario(tmp_path, "logs/net.toml", 1, 4), ["cluster.network.overhead_s=0"]).points()[0]
    assert per_iteration(point) == pytest.approx(0.3 + 6 * fit["alpha_s"] + 1.5 * M / fit["beta_Bps"], rel=1e-12)


def test_a_bad_profile_is_refused_naming_the_key(tmp_path: Path) -> None:
    for body, said in (("[network]\nlatency_s = -1.0\n", "key 'network.latency_s' = -1.0: must be ≥ 0"),
                       ("[network]\npingpong_latency_s = 1e-5\n", "'network.pingpong_latency_s': not a network"),
                       ("minibatch = [1]\n", "not a network profile"),
                       ("[network\n", "invalid TOML")):
        (tmp_path / "net.toml").write_text(body)
        with pytest.raises(ScenarioError) as e:
            load(ar_scenario(tmp_path, "net.toml", 2, 1))
        assert "key 'cluster.network.profile'" in str(e.value) and said in str(e.value)
    with pytest.raises(ScenarioError, match="no such network profile"):
        load(ar_scenario(tmp_path, "missing.toml", 2, 1))


def test_a_gloo_measurement_writes_a_sane_profile(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # two gloo processes on loopback: the profile is written and its numbers positive and
    # finite (a measured latency's value is the machine's, never asserted)
    out = tmp_path / "net.toml"
    assert main(["calibrate", "--network", "--max-bytes", str(1 << 22), "--out", str(out)]) == 0
    assert "network profile:" in capsys.readouterr().out
    net = load_network_profile(out)
    assert set(net) == {"latency_s", "bandwidth_Bps", "overhead_s"}
    assert 0 <= net["latency_s"] < math.inf and 0 < net["bandwidth_Bps"] < math.inf
    fit = tomllib.loads(out.read_text())["fit"]
    assert (fit["ranks"], fit["collective"], fit["source"]) == (2, "all_reduce", "torch.distributed gloo")


def test_min_bytes_fits_only_the_rows_of_the_messages_that_matter(tmp_path: Path) -> None:
    # a log whose two smallest rows follow another regime (10× slower, as NCCL's small-message
    # protocol can be): fitted from 16 KiB up, α and β come back; fitted on all rows, they do not
    slow = {s: f"{10 * closed_form('all_reduce', 8, 20e-6, 1e10, s) * 1e6:.2f}" for s in SIZES[:2]}
    log = tmp_path / "ar.log"
    log.write_text(synth_log(20e-6, 1e10, 8, times_us=slow))
    out = tmp_path / "net.toml"
    assert main(["calibrate", "--nccl-tests", str(log), "--out", str(out)]) == 0
    assert tomllib.loads(out.read_text())["fit"]["alpha_s"] > 20e-6 * 1.05
    assert main(["calibrate", "--nccl-tests", str(log), "--out", str(out), "--min-bytes", str(SIZES[2])]) == 0
    fit = tomllib.loads(out.read_text())["fit"]
    assert fit["alpha_s"] == pytest.approx(20e-6, rel=1e-3) and fit["beta_Bps"] == pytest.approx(1e10, rel=1e-3)
    assert fit["timings"] == 2 * (len(SIZES) - 2)


def test_a_sweep_over_profiles_gives_each_point_its_numbers(tmp_path: Path) -> None:
    # two profiles in a sweep (relative paths, against the scenario's folder): each point the
    # closed form of its own α and β, and two run ids
    M = 25_557_032 * 4
    for name, (a, b) in {"fast.toml": (5e-6, 2e10), "slow.toml": (50e-6, 1e9)}.items():
        (tmp_path / name).write_text(f"[network]\nlatency_s = {a!r}\nbandwidth_Bps = {b!r}\noverhead_s = 0.0\n")
    path = ar_scenario(tmp_path, "unused.toml", 4, 1)
    path.write_text(path.read_text() + '[sweep]\n"cluster.network.profile" = ["fast.toml", "slow.toml"]\n')
    points = load(path).points()
    assert [per_iteration(p) for p in points] == pytest.approx(
        [0.3 + 6 * 5e-6 + 1.5 * M / 2e10, 0.3 + 6 * 50e-6 + 1.5 * M / 1e9], rel=1e-12)
    assert len({p["_id"] for p in points}) == 2


def test_a_compute_profiles_options_are_refused_with_a_network_profile_and_sizes_once(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "net.toml"
    for extra in (["--model", "lenet"], ["--minibatches", "1,2"], ["--no-cycle"]):
        err = _refused(capsys, ["calibrate", "--nccl-tests", str(REAL_LOG), "--out", str(out), *extra])
        assert f"{extra[0]}: only for a compute profile" in err
    err = _refused(capsys, ["calibrate", "--minibatches", "4,8,4", "--out", str(tmp_path / "c.toml")])
    assert "size 4 is given twice" in err
    assert not out.exists() and not (tmp_path / "c.toml").exists()
