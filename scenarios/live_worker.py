"""Entry point for live runs launched by ``torchrun`` across machines.

    torchrun --nnodes M --nproc-per-node K --rdzv-endpoint HOST:PORT \\
        -m ddlsim.scenarios.live_worker SCENARIO --point 0 --out DIR [--set KEY=VALUE ...]

World size must be λ + 1 (parameter server: rank 0 is the server) or N (allreduce, sgp,
dpsgd). Rank 0 writes ``DIR/trace.ddlt`` (the measured trace) and ``DIR/weights.pt``; replay
the trace with ``ddlsim`` afterwards for accuracy. Machines' clocks should be synchronised
(NTP): the trace's times come from each process's wall clock.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..backends.base import BackendError
from ..backends.live import play, role, world_size
from ..simulator.protocols import live_refusal
from ..simulator.run import simulate
from .cli_common import resolve_scenario
from .load import load
from .schema import ScenarioError


def main(argv: list[str] | None = None) -> int:
    """Run this process's rank of one sweep point; 2 (one line on stderr) for bad input."""
    ap = argparse.ArgumentParser(prog="ddlsim.scenarios.live_worker")
    ap.add_argument("scenario", help="scenario file, or the name of a bundled scenario")
    ap.add_argument("--point", type=int, default=0, help="index of the sweep point to run")
    ap.add_argument("--out", required=True, help="directory for the trace and weights (rank 0)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    args = ap.parse_args(argv)
    try:
        points = load(resolve_scenario(args.scenario), args.set).points()
        if not 0 <= args.point < len(points):
            raise ScenarioError(f"--point {args.point}: the sweep has {len(points)} points")
        point = points[args.point]
        refusal = live_refusal(point)
        if refusal:
            raise BackendError(refusal)
        world = int(os.environ.get("WORLD_SIZE", "0"))
        if world != world_size(point):
            raise ScenarioError(f"WORLD_SIZE = {world}, but this point needs {world_size(point)} processes")
    except (ScenarioError, BackendError) as e:
        print(f"ddlsim: error: {e}", file=sys.stderr)
        return 2
    rank = int(os.environ["RANK"])
    os.makedirs(args.out, exist_ok=True)
    sigma = simulate(point).trace.inputs["staleness"] if rank == 0 else []
    play(point, rank, float(sigma.mean()) if len(sigma) else 0.0, args.out)
    print(f"{role(point, rank)} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
