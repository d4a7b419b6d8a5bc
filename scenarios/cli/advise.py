"""``ddlsim advise`` on the command line, and the successive halving options ``ddlsim run
--prune`` shares with it."""

from __future__ import annotations

import argparse
from typing import Any

from ...backends.device import resolve_device
from ...simulator.results_folder import ResultsFolder
from ..advise.render import TOP, render
from ..advise.search import MIN_FRACTION, REDUCTION_FACTOR, advise, check_goal, rung_fractions
from ..bundled import resolve_scenario
from ..load import load
from ..schema import ScenarioError
from .common import UsageError, add_data_options, add_scenario_options, check_data_sets, out_dir
from .cost import check_cost


def cmd_advise(args: argparse.Namespace) -> int:
    check_goal(args.budget_s, args.target_error, args.replay, args.jobs, args.min_fraction, args.reduction_factor)
    if args.top < 0:
        raise ScenarioError(f"--top = {args.top}: must be ≥ 0 (0 prints every row)")
    scenario = load(resolve_scenario(args.scenario), args.set)
    check_cost(scenario, args.force)
    if args.device is not None:
        resolve_device(args.device)  # an empty, unknown or unavailable device fails before any work
    check_data_sets(scenario, "replay", args.data_dir, args.download)  # so does a data set that cannot be read
    out = out_dir(args, scenario, "-advise")
    options = {"device": args.device, "data_dir": args.data_dir, "download": args.download}
    with ResultsFolder.open(out, force=args.force):
        adv = advise(scenario, out, budget_s=args.budget_s, target_error=args.target_error,
                     replay=args.replay, jobs=args.jobs, resume=args.resume, progress=not args.quiet,
                     options=options, min_fraction=args.min_fraction, reduction_factor=args.reduction_factor)
    print(render(adv, top=args.top or None))
    return 0 if adv.recommendation is not None else 1


def register(sub: Any) -> None:
    """Add ``ddlsim advise`` to the parser."""
    p = sub.add_parser("advise", help="search a sweep by simulation and successive halving of its replays, "
                       "recommend a configuration for a time budget or a target error")
    add_scenario_options(p, "results/<scenario name>-advise", executors=False)
    goal = p.add_argument_group("goal (exactly one)")
    goal.add_argument("--budget-s", type=float, metavar="T",
                      help="simulated seconds available: minimise the test error at T")
    goal.add_argument("--target-error", type=float, metavar="E",
                      help="test error to reach (fraction, e.g. 0.08): minimise the time to reach it")
    add_halving_options(p, MIN_FRACTION, REDUCTION_FACTOR)
    p.add_argument("--replay", type=int, default=None, metavar="K",
                   help="at most K configurations continue past any rung (default: as many as halving keeps)")
    p.add_argument("--top", type=int, default=TOP, metavar="N",
                   help=f"print the first N rows of the table (default {TOP}; 0: all); advice.csv and "
                        "advice.txt hold every row")
    add_data_options(p)
    p.set_defaults(func=cmd_advise)


def add_halving_options(p: Any, min_fraction: float | None, reduction_factor: float | None) -> None:
    """``--min-fraction`` and ``--reduction-factor``, the rungs of successive halving (defaults
    given, or None where they only mean something with another option)."""
    p.add_argument("--min-fraction", type=float, default=min_fraction, metavar="F",
                   help=f"successive halving's first rung: the fraction of each point's epochs replayed first "
                        f"(default {MIN_FRACTION:g}; 1 replays every point whole)")
    p.add_argument("--reduction-factor", type=float, default=reduction_factor, metavar="ETA",
                   help=f"the best 1/ETA of each rung continue to the next (default {REDUCTION_FACTOR:g})")


def check_prune(args: argparse.Namespace) -> None:
    """``ddlsim run``'s successive halving options: refused in one line when they mean nothing
    (without ``--prune``, or with an option ``--prune`` does not honour) or are out of range."""
    given = [o for o, v in (("--min-fraction", args.min_fraction), ("--reduction-factor", args.reduction_factor))
             if v is not None]
    if not args.prune:
        if given:
            raise UsageError(f"{given[0]} without --prune: it sets the rungs of successive halving; add --prune")
        return
    for opt, on in (("--traces", args.traces), ("--keep-failed", args.keep_failed)):
        if on:
            raise UsageError(f"{opt} with --prune: not supported (a point stopped at a rung has no whole "
                             "replay); run without --prune")
    args.min_fraction = MIN_FRACTION if args.min_fraction is None else args.min_fraction
    args.reduction_factor = REDUCTION_FACTOR if args.reduction_factor is None else args.reduction_factor
    rung_fractions(args.min_fraction, args.reduction_factor)
