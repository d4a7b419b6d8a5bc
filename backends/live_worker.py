"""Entry point for live runs launched by ``torchrun`` across machines.

    torchrun --nnodes M --nproc-per-node K --rdzv-endpoint HOST:PORT \\
        -m ddlsim.backends.live_worker SCENARIO --point 0 --out DIR [--set KEY=VALUE ...]

World size must be λ + 1 (parameter server: rank 0 is the server) or N (allreduce, sgp).
Rank 0 writes ``DIR/trace.ddlt`` (the measured trace) and ``DIR/weights.pt``; replay the
trace with ``ddlsim`` afterwards for accuracy. Machines' clocks should be synchronised
(NTP): the trace's times come from each process's wall clock.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    from ..scenarios.cli import resolve_scenario
    from ..scenarios.load import load
    from ..scenarios.schema import ScenarioError
    from ..simulator.run import simulate
    from .live import role, world_size

    ap = argparse.ArgumentParser(prog="ddlsim.backends.live_worker")
    ap.add_argument("scenario")
    ap.add_argument("--point", type=int, default=0, help="index of the sweep point to run")
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args(argv)
    try:
        points = load(resolve_scenario(args.scenario), args.set).points()
    except ScenarioError as e:
        print(f"ddlsim: error: {e}", file=sys.stderr)
        return 2
    if not 0 <= args.point < len(points):
        print(f"ddlsim: error: --point {args.point}: the sweep has {len(points)} points", file=sys.stderr)
        return 2
    point = points[args.point]
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world != world_size(point):
        print(f"ddlsim: error: WORLD_SIZE = {world}, but this point needs {world_size(point)} processes",
              file=sys.stderr)
        return 2
    rank = int(os.environ["RANK"])
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    sigma = simulate(point).trace.inputs["staleness"] if rank == 0 else np.zeros(0)
    dist.init_process_group("gloo", timeout=timedelta(seconds=point["live"]["timeout_s"]))
    try:
        if point["protocol"]["name"] in ("hardsync", "softsync", "async", "ssp"):
            from .live_ps import learner, server

            server(point, float(sigma.mean()) if len(sigma) else 0.0, args.out) if rank == 0 else learner(point, rank)
        else:
            from .live_gossip import node

            node(point, rank, args.out)
    finally:
        dist.destroy_process_group()
    print(f"{role(point, rank)} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
