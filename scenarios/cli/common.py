"""What the ``ddlsim`` commands share: the scenario argument and its options, output folders,
the data sets a backend will read.

The command modules import from here; nothing here imports a command module.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from ...backends.data_files import check_data, data_files
from ...simulator import trace as trace_io
from ...simulator.catalog import EMBEDDED_DATASETS
from ...simulator.protocols.catalog import SPECS
from ..bundled import CATALOGUE, resolve_scenario
from ..load import load
from ..messages import escape

NAME_MAX_BYTES = 200  # a folder named after a scenario, so that a suffix ("-advise") keeps it ≤ 255 bytes


class UsageError(Exception):
    """A command-line mistake that is not about the scenario file."""


def claim_report(folder: Any) -> None:
    """Claim the figures and report a command writes last in ``folder`` (a ResultsFolder), so
    that a file of the user's under those names is refused before any work."""
    from ...analysis.figures import FIGURES, FORMATS

    folder.claim([f"figures/{f.name}.{fmt}" for f in FIGURES for fmt in FORMATS] + ["report.html"])


def read_replayable_trace(path: str) -> Any:
    """The trace at ``path``, refused in one line (:class:`TraceError`) unless a replay could
    execute it (``check_replayable``) and its header names a protocol ddlsim has: what the
    trace ran is then known for the checks that compare it with a scenario's point."""
    trace = trace_io.read(path)
    trace_io.check_replayable(trace, path)
    proto = trace.header.get("protocol")
    if proto not in SPECS:
        raise trace_io.TraceError(f"{path}: header 'protocol' = {escape(repr(proto))}: not a protocol ddlsim has "
                                  f"(one of {', '.join(sorted(SPECS))})")
    return trace


def load_scenario(args: argparse.Namespace) -> Any:
    """The scenario named by ``args.scenario`` with the ``--set`` overrides, validated."""
    return load(resolve_scenario(args.scenario), args.set)


def safe_name(name: str) -> str:
    """A scenario name usable as one directory name: no separators, no control characters, only
    characters the file system's encoding can write, at most 100 characters and
    :data:`NAME_MAX_BYTES` bytes in that encoding (a folder name may have 255; the rest is room
    for a suffix such as "-advise"), cut at a character, so a long CJK name stays readable."""
    encoding = sys.getfilesystemencoding()

    def writable(c: str) -> str:
        try:
            c.encode(encoding)
        except UnicodeEncodeError:
            return "_"
        return c

    clean = "".join(writable(c) for c in re.sub(r"[^\w.+-]", "_", name)).strip(".") or "scenario"
    out, size = [], 0
    for c in clean[:100]:
        size += len(c.encode(encoding))
        if size > NAME_MAX_BYTES:
            break
        out.append(c)
    return "".join(out).rstrip(".") or "scenario"


def out_dir(args: argparse.Namespace, scenario: Any, suffix: str = "") -> Path:
    """``--out``, or ``results/<name><suffix>``: the scenario file's name for a file (an edited
    copy of ``demo`` named ``my.toml`` writes into results/my, not into the demo's results),
    the bundled name for a bundled scenario. What may be written there is the results
    folder's rule (:mod:`ddlsim.simulator.results_folder`)."""
    if args.out is not None and not args.out.strip():
        raise UsageError("--out '': an empty path names no folder (leave --out out for results/<name>)")
    if args.out:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: exists and is not a directory")
        return out
    source = resolve_scenario(args.scenario)
    name = source.stem if source.parent != CATALOGUE else str(scenario.base["name"])
    return Path("results") / (safe_name(name) + suffix)


def check_data_sets(scenario: Any, backend: str, data_dir: str | None, download: bool) -> None:
    """Refuse, before any work, a point whose data set ``backend`` (replay or live; others
    are not checked) could not read; live points with emulated compute read none. Each data
    set that needs files is really read (and, with ``download``, fetched) once, here: an
    empty ``--data-dir`` or an unreachable download fails now, not after the simulations.
    Files that are not the official ones are a warning line; the training samples found
    become the scenario's ``data_sizes`` (the default epoch; a larger
    ``workload.samples_per_epoch`` is refused)."""
    if backend not in ("replay", "live"):
        return
    seen: set[str] = set()
    said: list[str] = []
    for point in scenario.points():
        if backend == "replay" or point["live"]["compute"] == "real":
            check_data(point, data_dir, download)
            name = point["workload"]["dataset"]
            if name not in seen and name not in EMBEDDED_DATASETS:
                seen.add(name)
                files = data_files(name, data_dir, download)
                said += [f"ddlsim: warning: {line}" for line in files.warnings]
                said += [f"ddlsim: {line}" for line in files.notes]
                scenario.data_sizes[name] = len(files.train_y)
    if seen:
        scenario.points()  # samples_per_epoch follows the files found; more than there are is refused now
    elif data_dir is not None:
        names = sorted({p["workload"]["dataset"] for p in scenario.points()})
        raise UsageError(f"--data-dir {data_dir}: no point of this sweep reads a data set from files ("
                         f"{', '.join(names)}: embedded or generated); leave it out")
    for line in said:
        print(escape(line), file=sys.stderr)


def add_scenario_options(p: argparse.ArgumentParser, out_default: str = "results/<scenario name>",
                         executors: bool = True) -> None:
    """The scenario argument and the sweep options (``--set``, ``--out``, ``--jobs``, …);
    ``executors``: also ``--executor``, ``--scheduler`` and ``--force``."""
    p.add_argument("scenario", help="scenario file, or the name of a bundled scenario")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key (a list value sweeps it); repeatable")
    p.add_argument("--out", help=f"results directory (default {out_default})")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel worker processes (default: none, in-process, for up to 8 distinct simulations; "
                        "else one per core)")
    p.add_argument("--resume", action="store_true",
                   help="keep the points already completed in --out whose results verify; rerun the rest")
    p.add_argument("--keep-failed", action="store_true", help="with --resume: do not retry points that failed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--engine", choices=("auto", "simpy", "fast"), default="auto",
                   help="simulator engine: fast (byte-identical compiled engines for the parameter-server and "
                        "gossip protocols, refused before any run where one does not apply; needs numba), "
                        "simpy (the reference) or auto (fast where it applies; default)")
    p.add_argument("--traces", action="store_true",
                   help="also write each run's trace.ddlt (runs sharing a simulation share the file)")
    p.add_argument("--force", action="store_true",
                   help="run a sweep above the size limits, or write into a results directory that holds "
                        "another scenario's results")
    if executors:
        p.add_argument("--executor", choices=("local", "dask"), default="local",
                       help="where points run: local worker processes, or a Dask cluster (default local)")
        p.add_argument("--scheduler", help="Dask scheduler address (with --executor dask; without it a "
                                           "LocalCluster of --jobs workers is started)")


def add_data_options(p: argparse.ArgumentParser) -> None:
    """Where a backend runs and reads its data: ``--device``, ``--data-dir``, ``--download``."""
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--data-dir", help="directory with CIFAR10/MNIST/FashionMNIST files")
    p.add_argument("--download", action="store_true",
                   help="download torchvision data sets into --data-dir (default ~/.cache/ddlsim/data); checked "
                        "before any simulation")
