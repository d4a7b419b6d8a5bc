"""A results folder records what its replays' rounding depended on: each run's result.json
its ``numerics`` (backends.device.numerics, computed where the run ran), scenario.json what the
folder's backend results were computed with (one string, or each with its count of runs),
absent for simulate-only runs, exposed as Results.numerics; --resume over runs kept from
another machine says so on stderr. Truths: torch's own version and CPU capability,
platform.machine(), and result.json files rewritten by hand as another machine's."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddlsim.analysis.results import load_results
from ddlsim.backends.device import numerics
from ddlsim.scenarios.runner import store_result

# one point (hardsync, 2 learners, 1 epoch of digits on the MLP): a replay of about a second
TINY = """
name = "tiny-numerics"
seed = 3
[workload]
dataset = "digits"
model = "mlp"
epochs = 1
evals_per_epoch = 1
target_error = 0.5
[optimizer]
lr = 0.1
[cluster]
learners = 2
minibatch = 32
[protocol]
name = "hardsync"
"""

ELSEWHERE = "torch 0.0, AVX512 CPU kernels, GenuineIntel x86_64"


def ddlsim(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddlsim", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


def run(scenario: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    done = ddlsim("run", scenario, "--out", out, "--quiet", "--no-report", "--device", "cpu", *extra)
    assert done.returncode == 0, done.stderr
    return done


def scenario_json(out: Path) -> dict:
    return json.loads((out / "scenario.json").read_text(encoding="utf-8"))


def mismatch_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if " of the kept runs were replayed with " in line]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("numerics") / "tiny.toml"
    path.write_text(TINY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def replayed(tiny: Path) -> Path:
    out = tiny.parent / "out"
    run(tiny, out)
    return out


def test_cpu_numerics_name_torch_its_kernels_and_the_architecture():
    here = numerics("cpu")
    assert here.startswith(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} CPU kernels, ")
    assert here.endswith(f" {platform.machine()}")
    assert numerics("cpu") == here  # the same machine, the same string


def test_a_replay_records_this_machines_numerics(replayed: Path):
    assert scenario_json(replayed)["numerics"] == numerics("cpu")
    assert load_results(replayed).numerics == numerics("cpu")


def test_a_simulate_only_run_records_no_numerics(tiny: Path, tmp_path: Path):
    out = tmp_path / "sim"
    done = ddlsim("simulate", tiny, "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    info = scenario_json(out)
    assert "numerics" not in info and info["points"]  # the file is there, with its points, but no numerics
    assert load_results(out).numerics is None


def replayed_elsewhere(out: Path, numerics_there: str | None) -> None:
    """Every run in ``out`` as if replayed on another machine: its result.json's ``numerics``
    set (None: removed, a result of an earlier ddlsim), stored with its checksum as the runner does."""
    for path in (out / "runs").glob("*/result.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        record.pop("checksum")
        record.pop("numerics", None)
        if numerics_there is not None:
            record["numerics"] = numerics_there
        store_result(out, record)


def test_each_run_records_the_numerics_it_was_replayed_with(replayed: Path):
    (path,) = (replayed / "runs").glob("*/result.json")
    assert json.loads(path.read_text(encoding="utf-8"))["numerics"] == numerics("cpu")


def test_resume_over_a_run_kept_from_elsewhere_says_so_and_records_both(tiny: Path, replayed: Path, tmp_path: Path):
    out = tmp_path / "out"
    shutil.copytree(replayed, out)
    replayed_elsewhere(out, ELSEWHERE)
    here = numerics("cpu")
    # a second replicate: the one run there is kept, one more runs here (--quiet hides "resume: kept
    # 1, running 1", not the line on the numerics)
    done = run(tiny, out, "--resume", "--set", "replicates=2")
    (line,) = mismatch_lines(done.stderr)
    assert line.startswith(f"resume: 1 of the kept runs were replayed with {ELSEWHERE}; this machine's: {here}")
    assert "run without --resume to rerun them here" in line
    both = f"{ELSEWHERE} (1 run); {here} (1 run)"
    after = scenario_json(out)
    assert after["numerics"] == both and len(after["points"]) == 2
    assert len(list((out / "runs").iterdir())) == 2  # the kept run and the one replayed here
    assert load_results(out).numerics == both
    # resumed again here, with a third replicate: still one run from elsewhere, no nesting
    done = run(tiny, out, "--resume", "--set", "replicates=3")
    (line,) = mismatch_lines(done.stderr)
    assert line.startswith(f"resume: 1 of the kept runs were replayed with {ELSEWHERE}; ")
    assert scenario_json(out)["numerics"] == f"{ELSEWHERE} (1 run); {here} (2 runs)"


def test_resume_with_every_run_kept_from_another_machine_keeps_their_record(tiny: Path, replayed: Path, tmp_path: Path):
    out = tmp_path / "out"
    shutil.copytree(replayed, out)
    replayed_elsewhere(out, ELSEWHERE)
    done = run(tiny, out, "--resume")
    (line,) = mismatch_lines(done.stderr)
    assert line.startswith(f"resume: 1 of the kept runs were replayed with {ELSEWHERE}; this machine's: ")
    assert scenario_json(out)["numerics"] == ELSEWHERE  # nothing was replayed here


def test_resume_over_runs_without_a_record_does_not_claim_this_machine(tiny: Path, replayed: Path, tmp_path: Path):
    out = tmp_path / "out"
    shutil.copytree(replayed, out)
    replayed_elsewhere(out, None)  # a results folder of an earlier ddlsim
    done = run(tiny, out, "--resume")
    assert mismatch_lines(done.stderr) == []
    assert scenario_json(out)["numerics"] == "unrecorded (1 run)"
    done = run(tiny, out, "--resume", "--set", "replicates=2")
    assert scenario_json(out)["numerics"] == f"unrecorded (1 run); {numerics('cpu')} (1 run)"


def test_resume_on_the_same_numerics_says_nothing_of_them(tiny: Path, replayed: Path, tmp_path: Path):
    out = tmp_path / "out"
    shutil.copytree(replayed, out)
    done = run(tiny, out, "--resume")
    assert mismatch_lines(done.stderr) == []
    assert scenario_json(out)["numerics"] == numerics("cpu")
    assert load_results(out).numerics == numerics("cpu")


def test_ddlsim_replay_of_one_trace_records_this_machines_numerics(tiny: Path, tmp_path: Path):
    sim = tmp_path / "sim"
    done = ddlsim("simulate", tiny, "--out", sim, "--quiet", "--traces")
    assert done.returncode == 0, done.stderr
    (trace,) = (sim / "runs").glob("*/trace.ddlt")
    out = tmp_path / "r"
    done = ddlsim("replay", trace, "--scenario", tiny, "--out", out, "--device", "cpu", "--no-report")
    assert done.returncode == 0, done.stderr
    assert scenario_json(out)["numerics"] == numerics("cpu") == load_results(out).numerics


def test_resuming_one_folder_twice_in_a_process_names_the_other_machine_once(tiny: Path, replayed: Path,
                                                                              tmp_path: Path, capsys) -> None:
    # advise resumes its folder once a rung: the line is said once, not once a rung
    from ddlsim.scenarios.load import load
    from ddlsim.scenarios.runner import run_points

    out = tmp_path / "out"
    shutil.copytree(replayed, out)
    replayed_elsewhere(out, ELSEWHERE)
    scenario = load(tiny)
    for _ in range(2):
        run_points(scenario, scenario.points(), out, backend="replay", options={"device": "cpu"}, resume=True,
                   progress=False)
    assert len(mismatch_lines(capsys.readouterr().err)) == 1
