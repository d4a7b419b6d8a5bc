"""``ddlsim advise`` on the command line."""

from __future__ import annotations

import argparse
from typing import Any

from ..backends.device import resolve_device
from .advise import advise, check_goal
from .advise_render import TOP, render
from ..simulator.results_folder import ResultsFolder
from .cli_common import add_data_options, add_scenario_options, check_cost, check_data_sets, out_dir, resolve_scenario
from .load import load
from .schema import ScenarioError


def cmd_advise(args: argparse.Namespace) -> int:
    check_goal(args.budget_s, args.target_error, args.replay, args.jobs)
    if args.top < 0:
        raise ScenarioError(f"--top = {args.top}: must be ≥ 0 (0 prints every row)")
    scenario = load(resolve_scenario(args.scenario), args.set)
    check_cost(scenario, args.force)
    if args.device is not None:
        resolve_device(args.device)  # an empty, unknown or unavailable device fails before any work
    if args.replay > 0:  # so does a data set that cannot be read
        check_data_sets(scenario, "replay", args.data_dir, args.download)
    out = out_dir(args, scenario, "-advise")
    options = {"device": args.device, "data_dir": args.data_dir, "download": args.download}
    with ResultsFolder.open(out, force=args.force):
        adv = advise(scenario, out, budget_s=args.budget_s, target_error=args.target_error,
                     replay=args.replay, jobs=args.jobs, resume=args.resume, progress=not args.quiet,
                     options=options)
    print(render(adv, top=args.top or None))
    return 0 if adv.recommendation is not None else 1


def register(sub: Any) -> None:
    """Add ``ddlsim advise`` to the parser."""
    p = sub.add_parser("advise", help="search a sweep by simulation, replay the promising points, "
                       "recommend a configuration for a time budget or a target error")
    add_scenario_options(p, "results/<scenario name>-advise", executors=False)
    goal = p.add_argument_group("goal (exactly one)")
    goal.add_argument("--budget-s", type=float, metavar="T",
                      help="simulated seconds available: minimise the test error at T")
    goal.add_argument("--target-error", type=float, metavar="E",
                      help="test error to reach (fraction, e.g. 0.08): minimise the time to reach it")
    p.add_argument("--replay", type=int, default=4, metavar="K",
                   help="replay at most K points with real gradients (default 4)")
    p.add_argument("--top", type=int, default=TOP, metavar="N",
                   help=f"print the first N rows of the table (default {TOP}; 0: all); advice.csv and "
                        "advice.txt hold every row")
    add_data_options(p)
    p.set_defaults(func=cmd_advise)
