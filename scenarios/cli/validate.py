"""``ddlsim validate``: a sweep run live and simulated, compared."""

from __future__ import annotations

import argparse
from typing import Any

from ...backends.device import resolve_device
from ...simulator.results_folder import ResultsFolder
from ..bundled import resolve_scenario
from ..load import load
from ..schema import ScenarioError
from .common import out_dir


VALIDATE_FILES = ["validation.csv", "validation.png", "validation.svg"]


def cmd_validate(args: argparse.Namespace) -> int:
    from ..validate import check_points, table_lines, validate

    scenario = load(resolve_scenario(args.scenario), args.set)
    out = out_dir(args, scenario, "-validate")
    resolve_device(args.device)
    check_points(scenario.points(), args.profile, args.force)  # profile, live refusals, size: before any write
    with ResultsFolder.open(out, force=args.force) as folder:
        if folder.info.get("scenario") not in (None, scenario.base["name"]) and not args.force:
            raise ScenarioError(f"--out {out}: holds the results of scenario {folder.info['scenario']!r}; choose "
                                "another --out or --force")
        folder.info["scenario"] = scenario.base["name"]
        folder.claim(VALIDATE_FILES)
        rows = validate(scenario, out, args.profile, progress=not args.quiet, resume=args.resume,
                        device=args.device, force=args.force)
    for line in table_lines(rows, out):  # a figure that is not a number is "n/a", never "nan%"
        print(line)
    return 0


def register(sub: Any) -> None:
    """Add ``validate`` to the ``ddlsim`` parser."""
    p = sub.add_parser("validate", help="run the sweep live and simulated; compare time, throughput, staleness",
                       description="Run every point live and simulated and compare them. Live runs go one at a "
                                   "time, so there is no --jobs: parallel runs would disturb the timings they "
                                   "measure.")
    p.add_argument("scenario", help="scenario file, or the name of a bundled scenario (e.g. validate-grid)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key (a list value sweeps it); repeatable")
    p.add_argument("--profile", help="calibrated profile whose network/server costs the simulation uses")
    p.add_argument("--out", help="output directory (default results/<name>-validate)")
    p.add_argument("--resume", action="store_true", help="keep the points already in OUT/validation.csv")
    p.add_argument("--force", action="store_true", help="write into a folder that holds another scenario's results")
    p.add_argument("--device", default="cpu", help="device of the live runs' real compute (cpu or cuda)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_validate)
