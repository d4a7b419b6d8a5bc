"""Entry point for live runs launched by ``torchrun`` across machines.

    torchrun --nnodes M --nproc-per-node K --rdzv-endpoint HOST:PORT \\
        -m ddlsim.scenarios.live_worker SCENARIO --point 0 --out DIR [--set KEY=VALUE ...]

World size must be λ + 1 (parameter server: rank 0 is the server) or N (allreduce, sgp,
dpsgd). Rank 0 writes ``DIR/trace.ddlt`` (the measured trace) and ``DIR/weights.pt``, and
prints where the trace is and the commands that come next (``ddlsim trace``, ``ddlsim
replay`` for the accuracy curves). Machines' clocks should be synchronised (NTP): the
trace's times come from each process's wall clock.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ..backends.base import BackendError
from ..backends.live import play, role, world_size
from ..simulator.compute import ProfileError
from ..simulator.protocols import live_refusal
from ..simulator.run import simulate
from .bundled import resolve_scenario
from .load import load
from .messages import escape
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
        world = _env_int("WORLD_SIZE")
        if world != world_size(point):
            raise ScenarioError(f"WORLD_SIZE = {world}, but this point needs {world_size(point)} processes")
        rank = _env_int("RANK")
        if not 0 <= rank < world:
            raise ScenarioError(f"RANK = {rank}: must be between 0 and WORLD_SIZE − 1 = {world - 1}")
    except (ScenarioError, BackendError, ProfileError, ValueError, OSError) as e:
        print(f"ddlsim: error: {escape(str(e))}", file=sys.stderr)
        return 2
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print(f"ddlsim: error: --out {escape(args.out)}: {e.strerror or e}", file=sys.stderr)
        return 2
    sigma = 0.0
    if rank == 0:
        trace = simulate(point).trace
        assert trace is not None  # simulate keeps the trace unless told not to
        staleness = trace.inputs["staleness"]
        sigma = float(staleness.mean()) if len(staleness) else 0.0
    play(point, rank, sigma, args.out)
    print(f"{role(point, rank)} done", file=sys.stderr)
    if rank == 0:
        print(next_steps(os.path.join(args.out, "trace.ddlt")))
    return 0


def next_steps(trace: str) -> str:
    """What rank 0 prints at the end: where the measured trace is, and the commands that
    check it and turn it into accuracy curves (the trace records its point: no scenario needed)."""
    quoted = shlex.quote(trace)
    return (f"measured trace: {trace}\n"
            f"  check it:           ddlsim trace {quoted}\n"
            f"  accuracy curves:    ddlsim replay {quoted}")


def _env_int(name: str) -> int:
    """The integer in environment variable ``name`` (torchrun sets it), or one error line."""
    value = os.environ.get(name)
    if value is None:
        raise ScenarioError(f"{name} is not set: launch this module with torchrun (see docs/live.md)")
    try:
        return int(value)
    except ValueError:
        raise ScenarioError(f"{name} = {value!r}: not an integer") from None


if __name__ == "__main__":
    sys.exit(main())
