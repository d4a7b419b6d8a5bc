"""SHA-256 of every bundled scenario's simulated traces and summaries (a refactor check).

    python benchmarks/trace_digests.py > before.json     # on the previous commit
    python benchmarks/trace_digests.py > after.json      # on the change
    diff before.json after.json                          # empty: byte-identical traces

Each line is one sweep point: scenario, run id, the digest of the trace (header and columns) and the
digest of its summary row (``wall``-clock keys excluded). ``--only NAME`` limits the run to
some scenarios; ``--jobs`` runs points in parallel processes (default: the cores);
``--engine simpy`` and ``--engine fast`` digest the points a fast engine covers with that
engine (the two outputs must be equal: the fast engine's byte-identity on bundled scenarios).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

def _digest(args: tuple[str, int, list[str], str]) -> dict:
    from ddlsim.scenarios.load import load
    from ddlsim.simulator import trace as tracemod
    from ddlsim.simulator.run import fast_engine, simulate

    path, index, overrides, engine = args
    point = load(path, overrides).points()[index]
    if engine != "auto" and fast_engine(point)[0] is None:
        return {"scenario": Path(path).stem, "run_id": point["_id"], "skipped": "not covered by the fast engine"}
    sim = simulate(point, engine)
    h = hashlib.sha256(json.dumps(sim.trace.header, sort_keys=True, default=str).encode())
    for table, spec in ((sim.trace.ops, tracemod.OP_COLUMNS), (sim.trace.inputs, tracemod.INPUT_COLUMNS)):
        for name, dtype in spec.items():
            h.update(table[name].astype(dtype).tobytes())
    summary = json.dumps(sim.summary, sort_keys=True, default=float)
    return {"scenario": Path(path).stem, "run_id": point["_id"],
            "trace": h.hexdigest(), "summary": hashlib.sha256(summary.encode()).hexdigest()}


def main() -> None:
    import ddlsim.scenarios as scenarios_pkg
    from ddlsim.scenarios.load import load

    catalogue = Path(scenarios_pkg.__file__).resolve().parent / "catalogue"
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--dir", help="scenario folder (default: the bundled catalogue)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--engine", default="auto", choices=("auto", "simpy", "fast"),
                    help="simpy/fast: only the points a fast engine covers (compare the two outputs)")
    args = ap.parse_args()
    work = []
    if args.dir:
        catalogue = Path(args.dir)
    for f in sorted(catalogue.glob("*.toml")):
        if args.only and f.stem not in args.only:
            continue
        n = len(load(f, args.set).points())
        work += [(str(f), i, args.set, args.engine) for i in range(n)]
    with ProcessPoolExecutor(args.jobs) as ex:
        for row in ex.map(_digest, work):
            print(json.dumps(row, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
