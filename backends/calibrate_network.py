"""``ddlsim calibrate --nccl-tests LOG`` and ``ddlsim calibrate --network``: a network profile.

* ``--nccl-tests LOG``: the timings of an ``all_reduce_perf`` / ``all_gather_perf`` run
  (simulator/network_profile.py reads them), fitted to α and β;
* ``--network``: all-reduces of 8 B … ``--max-bytes`` among ``--ranks`` local processes
  with torch.distributed (gloo on CPU; nccl with ``--device cuda``, one GPU per process),
  the median of three trials per size, fitted the same way.

The profile's ``[network]`` keys are the fitted link's: ``inter`` (between nodes:
``latency_s``, ``bandwidth_Bps``, ``overhead_s = 0``) when the ranks ran on several hosts,
or for gloo processes (the live backend runs every learner as a node); ``intra``
(``intra_latency_s``, ``intra_bandwidth_Bps``) for the GPUs of one host. ``--scope`` says
otherwise. docs/network-calibration.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from ..simulator.files import atomic_write, check_target, read_bounded
from ..simulator.network_profile import (NETWORK_PROFILE_HEAD, SCOPES, CollectiveLog, Fit, LogError, fit_alpha_beta,
                                         fit_log, profile_text, read_nccl_tests)
from .base import BackendError
from .device import resolve_device

MAX_SWEEP_BYTES = 1 << 30
MIN_SWEEP_BYTES = 1 << 10
MAX_LOCAL_RANKS = 64


@dataclass(frozen=True)
class Calibration:
    """A written network profile: the fit, its scope, where it went and what it came from."""

    fit: Fit
    scope: str
    out: Path
    described: str
    hosts: int = 0


def check_out(out: Path, force: bool) -> bool:
    """Refuse (before any work) an ``out`` that is a link, a directory or a device, or an existing
    file that is not a network profile ddlsim wrote (unless ``force``); whether it existed."""
    check_target(out)
    existed = out.exists()
    if existed and not force and not read_bounded(out, 1 << 20, "network profile").startswith(
            NETWORK_PROFILE_HEAD.encode()):
        raise BackendError(f"--out {out}: exists and is not a network profile ddlsim wrote; name another file, "
                           "or --force")
    return existed


def _scope(scope: str | None, default: str | None, why: str) -> str:
    if scope is not None:
        if scope not in SCOPES:
            raise BackendError(f"--scope {scope}: one of {', '.join(SCOPES)}")
        return scope
    if default is None:
        raise BackendError(why)
    return default


def _write(out: Path, fit: Fit, scope: str, source: str, described: str, hosts: int, existed: bool) -> Calibration:
    try:
        atomic_write(out, profile_text(fit, scope, source, described, hosts))
    except BaseException:
        if not existed:
            out.unlink(missing_ok=True)
        raise
    return Calibration(fit, scope, out, described, hosts)


def from_nccl_tests(log_path: str, out: Path | None = None, force: bool = False, ranks: int | None = None,
                    collective: str | None = None, scope: str | None = None, min_bytes: int | None = None,
                    max_bytes: int | None = None) -> tuple[CollectiveLog, Calibration]:
    """Fit the rows of ``min_bytes`` … ``max_bytes`` (default: all) of the nccl-tests log
    ``log_path`` and write its profile to ``out`` (default ``profiles/network-STEM.toml``)."""
    for option, value in (("--min-bytes", min_bytes), ("--max-bytes", max_bytes)):
        if value is not None and value < 1:
            raise BackendError(f"{option} {value}: must be ≥ 1")
    if min_bytes is not None and max_bytes is not None and min_bytes > max_bytes:
        raise BackendError(f"--min-bytes {min_bytes} > --max-bytes {max_bytes}: no size between them")
    out = Path(out or f"profiles/network-{Path(log_path).stem}.toml")
    existed = check_out(out, force)
    log = read_nccl_tests(log_path, ranks, collective)
    lo, hi = min_bytes or 0, max_bytes or float("inf")
    kept = tuple(t for t in log.timings if lo <= t.nbytes <= hi)
    if len({t.nbytes for t in kept}) < 2:
        raise LogError(f"{log_path}: {len({t.nbytes for t in kept})} message size of the log within --min-bytes / "
                       "--max-bytes; the fit needs at least two")
    log = replace(log, timings=kept)
    default = None if log.hosts == 0 else ("inter" if log.hosts > 1 else "intra")
    chosen = _scope(scope, default, f"{log_path}: the log has no '#  Rank' lines, so not on how many hosts its "
                                    "ranks ran; give --scope intra (one machine) or --scope inter")
    fit = fit_log(log)
    hosts = f"{log.hosts} host{'s' if log.hosts != 1 else ''}" if log.hosts else "unstated hosts"
    sizes = f"{log.timings[0].nbytes}–{log.timings[-1].nbytes} B"
    described = f"{fit.collective} over {log.ranks} ranks on {hosts}, {sizes}, fitted to nccl-tests log " \
                f"{Path(log_path).name}"
    return log, _write(out, fit, chosen, "nccl-tests", described, log.hosts, existed)


def measured(out: Path | None = None, force: bool = False, ranks: int | None = None, device: str = "cpu",
             max_bytes: int | None = None, scope: str | None = None, host: str = "127.0.0.1") -> Calibration:
    """Time all-reduces among ``ranks`` (default 2) local processes (module doc), fit them and
    write the profile to ``out`` (default ``profiles/network-BACKEND-RANKS.toml``)."""
    from .calibrate import SWEEP_MAX_BYTES, sweep_sizes, time_allreduce

    world = 2 if ranks is None else ranks
    if not 2 <= world <= MAX_LOCAL_RANKS:
        raise BackendError(f"--ranks {world}: the measurement needs 2 to {MAX_LOCAL_RANKS} processes")
    top = SWEEP_MAX_BYTES if max_bytes is None else max_bytes
    if not MIN_SWEEP_BYTES <= top <= MAX_SWEEP_BYTES:
        raise BackendError(f"--max-bytes {top}: must be between {MIN_SWEEP_BYTES} and {MAX_SWEEP_BYTES}")
    backend = "nccl" if resolve_device(device).type == "cuda" else "gloo"  # an unknown device: one line
    chosen = _scope(scope, "intra" if backend == "nccl" else "inter", "")
    out = Path(out or f"profiles/network-{backend}-{world}.toml")
    existed = check_out(out, force)
    trials = time_allreduce(sweep_sizes(top), world, backend, host)
    sizes = sorted(trials)
    seconds = [statistics.median(trials[s]) for s in sizes]
    try:
        fit = fit_alpha_beta("all_reduce", world, [float(s) for s in sizes], seconds, where=f"{backend} sweep")
    except LogError as e:
        raise BackendError(f"{e} (a loaded machine; run it again)") from None
    described = f"all_reduce over {world} local {backend} processes, {sizes[0]}–{sizes[-1]} B, measured"
    return _write(out, fit, chosen, f"torch.distributed {backend}", described, 1, existed)


def report_lines(cal: Calibration) -> list[str]:
    """What the command prints: α, β, the fit's residuals, the keys written and the file."""
    f = cal.fit
    keys = ("latency_s, bandwidth_Bps, overhead_s = 0" if cal.scope == "inter"
            else "intra_latency_s, intra_bandwidth_Bps")
    worst = f" (line {f.worst_line})" if f.worst_line else ""
    return [f"{cal.described}",
            f"α = {f.alpha_s * 1e6:.3f} µs per step, β = {f.beta_Bps / 1e9:.4g} GB/s bus bandwidth",
            f"fit over {len(f.residuals)} timings: relative residual rms {f.rms_residual:.1%}, "
            f"max {f.max_residual:.1%}{worst}",
            f"{cal.scope}-node link: {keys}",
            *([f"the fit is one ring through all {f.ranks} ranks: a scenario of {cal.hosts} nodes × "
               f"{f.ranks // cal.hosts} GPUs charges it with protocol.allreduce_algorithm = \"ring\""]
              if cal.scope == "inter" and f.ranks > cal.hosts > 1 else []),
            f"network profile: {cal.out}  (a scenario names it: cluster.network.profile)"]


__all__ = ["Calibration", "check_out", "from_nccl_tests", "measured", "report_lines"]
