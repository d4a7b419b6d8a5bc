"""``ddlsim scenarios``, ``ddlsim hardware`` and ``ddlsim trace``: what is bundled, and what a
trace file holds."""

from __future__ import annotations

import argparse
import tomllib
from typing import Any

import numpy as np

from ...simulator import trace as tracemod
from ...simulator.protocols.catalog import PS, SPECS
from ..bundled import CATALOGUE
from ..hardware import listing
from ..load import recorded_point
from ..messages import escape
from .common import UsageError, read_replayable_trace


def cmd_scenarios(args: argparse.Namespace) -> int:
    if args.show:
        f = CATALOGUE / f"{args.show}.toml"
        if not f.is_file():
            names = ", ".join(sorted(g.stem for g in CATALOGUE.glob("*.toml")))
            raise UsageError(f"--show {args.show}: no bundled scenario of that name (bundled: {names})")
        print(f.read_text(encoding="utf-8"), end="")
        return 0
    for f in sorted(CATALOGUE.glob("*.toml")):
        data = tomllib.loads(f.read_text())
        print(f"{f.stem:28s} {data.get('description', '')}")
    print("\nStart your own from one: ddlsim scenarios --show demo > my.toml")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    print(listing())
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    t = read_replayable_trace(args.path)  # what `ddlsim trace` accepts, `ddlsim replay` can execute
    if "replay_point" in t.header:  # a live run's point, which replay trains with: checked as replay checks it
        recorded_point(f"{args.path}: header 'replay_point'", t.header["replay_point"])
    kinds = {name: int((t.ops["kind"] == k).sum()) for k, name in enumerate(tracemod.KIND_NAMES)}
    print(f"{escape(args.path)}: schema {t.header['schema_version']}, "
          f"protocol {escape(str(t.header.get('protocol')))}, "
          f"{_trace_members(t)}, ops {t.n_ops} " + " ".join(f"{k}={v}" for k, v in kinds.items()))
    return 0


def _trace_members(t: Any) -> str:
    """Who ran a trace: a parameter-server trace's learners (those its grad ops name; its one
    state is the server's), else its nodes."""
    if SPECS[t.header["protocol"]].family != PS:
        return f"nodes {t.header['nodes']}"
    learners = np.count_nonzero(np.bincount(t.ops["node"][t.ops["kind"] == tracemod.GRAD], minlength=1))
    return f"learners {learners}"


def register(sub: Any) -> None:
    """Add ``scenarios``, ``hardware`` and ``trace`` to the ``ddlsim`` parser."""
    p = sub.add_parser("scenarios", help="list the bundled scenarios, or print one to start from")
    p.add_argument("--show", metavar="NAME", help="print bundled scenario NAME (e.g. > my.toml to edit a copy)")
    p.set_defaults(func=cmd_scenarios)
    p = sub.add_parser("hardware", help="list the hardware catalogue (cluster.gpu, cluster.network.preset)")
    p.set_defaults(func=cmd_hardware)
    p = sub.add_parser("trace", help="validate a trace file and print its op counts")
    p.add_argument("path", help="a trace.ddlt (ddlsim simulate/run --traces, or a live run's)")
    p.set_defaults(func=cmd_trace)
