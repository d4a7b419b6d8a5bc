"""Network profiles: α and β fitted to collective timings, written and read as TOML.

A ring collective over ``n`` ranks of ``S`` bytes takes (Thakur, Rabenseifner & Gropp 2005;
the bus-bandwidth model of nccl-tests' doc/PERFORMANCE.md):

* all-reduce: ``t(S) = 2(n−1)·α + 2(n−1)/n · S/β``;
* all-gather (and reduce-scatter): ``t(S) = (n−1)·α + (n−1)/n · S/β``,

``α`` the cost of one step (wire latency and software together), ``β`` the bus bandwidth
(nccl-tests' ``busbw = algbw · 2(n−1)/n`` for all-reduce, ``(n−1)/n`` for all-gather, tends
to ``β`` for large ``S``). :func:`fit_alpha_beta` fits ``α ≥ 0`` and ``β > 0`` by least
squares on the *relative* error of every timing (small and large messages weigh alike).

:func:`parse_nccl_tests` reads the output of nccl-tests' ``all_reduce_perf`` /
``all_gather_perf``; :func:`profile_text` writes a profile whose ``[network]`` table holds
``cluster.network`` keys; :func:`load_network_profile` reads one back (what the scenario key
``cluster.network.profile`` names). The module is pure: no torch, no scenarios.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .compute import ProfileError, read_profile_toml
from .files import FileRefused, read_bounded

NETWORK_PROFILE_HEAD = "# ddlsim network profile"  # the first line of every network profile ddlsim writes
LOG_MAX_BYTES = 16 << 20
MAX_RANKS = 1 << 20
# factors of (n−1) for the steps and of (n−1)/n for the bytes of each collective (module doc)
COLLECTIVES: dict[str, tuple[int, int]] = {"all_reduce": (2, 2), "all_gather": (1, 1)}
SCOPES = ("inter", "intra")
# the cluster.network keys a profile may set, each with its bounds (those of the scenario schema)
LATENCY_KEYS = ("latency_s", "overhead_s", "intra_latency_s")
BANDWIDTH_KEYS = ("bandwidth_Bps", "intra_bandwidth_Bps")
NETWORK_KEYS = LATENCY_KEYS + BANDWIDTH_KEYS
MAX_LATENCY_S = 1e6

_RANK_LINE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_THREADS = re.compile(r"\bnThread\s+(\d+)\s+nGpus\s+(\d+)\b")


class LogError(ProfileError):
    """A collective-timing log that cannot be read or fitted; one line naming the file and line."""


@dataclass(frozen=True)
class Timing:
    """One timing of a log: ``nbytes`` moved in ``seconds``, from line ``line``."""

    line: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class CollectiveLog:
    """What a log states: its ranks, hosts (distinct host names; 0 when unstated), the
    collective its bandwidths imply, and its timings (every time column of every row)."""

    source: str
    ranks: int
    hosts: int
    collective: str
    timings: tuple[Timing, ...]
    skipped_empty: int = 0


@dataclass(frozen=True)
class Fit:
    """``α`` (s per step), ``β`` (B/s) and the fit's relative residuals ``model/measured − 1``."""

    collective: str
    ranks: int
    alpha_s: float
    beta_Bps: float
    residuals: tuple[float, ...] = field(default=())
    lines: tuple[int, ...] = field(default=())

    @property
    def rms_residual(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals)) if self.residuals else 0.0

    @property
    def max_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)

    @property
    def worst_line(self) -> int:
        """The log line of the timing the fit misses most (0 when the timings have no lines)."""
        if not self.residuals or not self.lines:
            return 0
        return self.lines[int(np.argmax(np.abs(self.residuals)))]


def collective_time(collective: str, ranks: int, alpha_s: float, beta_Bps: float, nbytes: float) -> float:
    """Seconds of one ring ``collective`` of ``nbytes`` over ``ranks`` ranks (module doc)."""
    steps, volume = COLLECTIVES[collective]
    n = ranks
    return steps * (n - 1) * alpha_s + volume * (n - 1) / n * nbytes / beta_Bps


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' ``busbw / algbw`` of ``collective`` over ``ranks`` ranks: 2(n−1)/n or (n−1)/n."""
    return COLLECTIVES[collective][1] * (ranks - 1) / ranks


MIN_BANDWIDTH_SHARE = 0.01  # of the largest message's time, for a bandwidth to be fitted at all


def fit_alpha_beta(collective: str, ranks: int, nbytes: list[float], seconds: list[float],
                   lines: list[int] | None = None, where: str = "timings") -> Fit:
    """α ≥ 0 and β > 0 minimising Σ (t_model/t − 1)² over the timings (module doc); α is
    held at 0 when the unconstrained fit makes it negative. A sweep whose times do not grow
    with the size (the bandwidth term under 1 % of the largest message's time: no bandwidth to
    fit) or with fewer than two sizes is one :class:`LogError`."""
    if collective not in COLLECTIVES:
        raise LogError(f"{where}: unknown collective {collective!r} (one of {', '.join(COLLECTIVES)})")
    if ranks < 2:
        raise LogError(f"{where}: {ranks} rank: a collective of one rank moves nothing; the timings calibrate no link")
    if len(set(nbytes)) < 2:
        raise LogError(f"{where}: timings of at least two message sizes are needed to fit latency and bandwidth")
    steps, volume = COLLECTIVES[collective]
    s = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise LogError(f"{where}: every time must be a finite number > 0")
    x = np.full_like(s, steps * (ranks - 1)) / t          # α's coefficient, relative
    y = volume * (ranks - 1) / ranks * s / t               # (1/β)'s coefficient, relative
    (alpha, inv_beta), *_ = np.linalg.lstsq(np.column_stack([x, y]), np.ones_like(t), rcond=None)
    if alpha < 0:
        alpha, inv_beta = 0.0, float(np.sum(y) / np.sum(y * y))
    # the bandwidth term must carry a share of the largest message's time, or the times do not grow
    if not inv_beta > 0 or not math.isfinite(inv_beta) or float(np.max(y)) * inv_beta < MIN_BANDWIDTH_SHARE:
        raise LogError(f"{where}: the times do not grow with the message size ({len(t)} timings of "
                       f"{int(s.min())}–{int(s.max())} B): no bandwidth to fit; include larger messages")
    residuals = (x * alpha + y * inv_beta) - 1.0
    return Fit(collective, ranks, float(alpha), float(1.0 / inv_beta), tuple(float(r) for r in residuals),
               tuple(lines or ()))


def _number(token: str, what: str, where: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise LogError(f"{where}: {what} = {token!r}: not a number") from None
    if not math.isfinite(value):
        raise LogError(f"{where}: {what} = {token!r}: not a finite number")
    return value


# the units nccl-tests prints under its columns; the times' in seconds
TIME_UNITS = {"(us)": 1e-6, "(ms)": 1e-3}
OTHER_UNITS = frozenset({"(B)", "(elements)", "(GB/s)"})
MIN_TIME_S, MAX_TIME_S = 1e-9, 3600.0  # nccl-tests prints µs to two decimals; no collective takes an hour


def _time_unit(tokens: list[str], where: str) -> float:
    """Seconds per unit of the times of nccl-tests' units line ``tokens``; a unit it does not
    print, or times in two units, is one :class:`LogError`."""
    unknown = [t for t in tokens if t not in TIME_UNITS and t not in OTHER_UNITS]
    if unknown:
        raise LogError(f"{where}: unit {unknown[0]} is not one nccl-tests prints (times in {' or '.join(TIME_UNITS)})")
    units = {t for t in tokens if t in TIME_UNITS}
    if len(units) > 1:
        raise LogError(f"{where}: times in both {' and '.join(sorted(units))}: not one nccl-tests table")
    return TIME_UNITS[units.pop()] if units else TIME_UNITS["(us)"]


def _columns(tokens: list[str]) -> bool:
    """Whether ``tokens`` (a ``#`` line without its mark) is nccl-tests' column header."""
    return len(tokens) >= 4 and tokens[0] == "size" and "time" in tokens and "busbw" in tokens and "algbw" in tokens


def _noise(line: str) -> bool:
    """Lines NCCL or a launcher may interleave with the table (NCCL_DEBUG output, blank lines)."""
    return not line.strip() or " NCCL INFO " in line or " NCCL WARN " in line


def parse_nccl_tests(text: str, source: str, ranks: int | None = None, collective: str | None = None) -> CollectiveLog:
    """The timings of one nccl-tests result table in ``text`` (``source`` names it in errors).

    The table is the ``#`` column header (``size count type redop root time algbw busbw
    #wrong`` and again for the in-place columns; older versions omit ``root`` or ``redop``),
    its ``#`` units line (``(us)``, or ``(ms)``), then one row per size up to the next ``#``
    line. The ranks are the ``#  Rank  r … on HOST device …`` lines (or ``ranks``, which must
    agree with them); the collective is the one whose busbw/algbw factor the rows show (or
    ``collective``, which must agree). Rows of 0 bytes are skipped; sizes must increase,
    times be > 0, the largest size's time above the smallest's (in each time column), and
    ``#wrong`` 0 or N/A. Anything else is one :class:`LogError` naming the file and the line."""
    lines = text.splitlines()
    rank_hosts: dict[int, str] = {}
    header: list[str] | None = None
    header_line = 0
    unit = 1e-6
    rows: list[tuple[int, list[str]]] = []
    ended = False
    for number, raw in enumerate(lines, 1):
        where = f"{source}: line {number}"
        if raw.startswith("#"):
            body = raw[1:].split()
            if header is None:
                m = _RANK_LINE.match(raw)
                if m:
                    rank_hosts[int(m[1])] = m[2]
                elif _columns(body):
                    header, header_line = body, number
                continue
            if not rows and body and all(b.startswith("(") for b in body):  # the units line
                unit = _time_unit(body, where)
                continue
            if _columns(body):
                raise LogError(f"{where}: a second result table (the first began on line {header_line}); "
                               "give one run per file")
            if rows:
                ended = True
            continue
        if header is None or _noise(raw):
            continue
        tokens = raw.split()
        if ended:  # a launcher's message after the table is left alone; another result row is not
            if len(tokens) == len(header) and tokens[0].isdigit():
                raise LogError(f"{where}: a result row after the table ended (the table of line {header_line}); "
                               "give one run per file")
            continue
        if len(tokens) != len(header):
            raise LogError(f"{where}: {len(tokens)} fields where the column header (line {header_line}) has "
                           f"{len(header)} ({' '.join(header)}): not an nccl-tests result row")
        rows.append((number, tokens))
    if header is None:
        raise LogError(f"{source}: not an nccl-tests log (no '#  size  count … time  algbw  busbw' column header; "
                       "give the output of all_reduce_perf or all_gather_perf)")
    if not rows:
        raise LogError(f"{source}: line {header_line}: the result table has no rows")
    time_cols = [i for i, c in enumerate(header) if c == "time"]
    wrong_cols = [i for i, c in enumerate(header) if c == "#wrong"]
    timings: list[Timing] = []
    bandwidths: list[tuple[int, float, float]] = []  # (line, algbw, busbw)
    previous: tuple[int, int] | None = None
    empty = 0
    for number, tokens in rows:
        where = f"{source}: line {number}"
        size_value = _number(tokens[0], "size", where)
        if size_value < 0 or size_value != int(size_value):
            raise LogError(f"{where}: size = {tokens[0]!r}: must be a whole number of bytes ≥ 0")
        size = int(size_value)
        if size == 0:
            empty += 1
            continue
        if previous is not None and size <= previous[1]:
            raise LogError(f"{where}: size {size} after {previous[1]} (line {previous[0]}): sizes must increase "
                           "down the table")
        previous = (number, size)
        for col in wrong_cols:  # N/A where the run did not check (-c 0)
            if tokens[col] not in ("0", "N/A"):
                raise LogError(f"{where}: #wrong = {tokens[col]!r}: the collective returned wrong data in that "
                               "run; its times calibrate nothing (fix the run, then log it again)")
        for col in time_cols:
            seconds = _number(tokens[col], "time", where)
            if seconds <= 0:
                raise LogError(f"{where}: time = {tokens[col]!r}: must be > 0")
            if not MIN_TIME_S <= seconds * unit <= MAX_TIME_S:
                raise LogError(f"{where}: time = {tokens[col]!r} ({seconds * unit:.3g} s): not one collective's time "
                               "(between a nanosecond and an hour)")
            timings.append(Timing(number, size, seconds * unit))
            if col + 2 < len(tokens) and header[col + 1] == "algbw" and header[col + 2] == "busbw":
                bandwidths.append((number, _number(tokens[col + 1], "algbw", where),
                                   _number(tokens[col + 2], "busbw", where)))
    if not timings:
        raise LogError(f"{source}: line {header_line}: the result table has no rows of more than 0 bytes")
    for col in range(len(time_cols)):  # each time column (out-of-place, in-place) on its own
        column = timings[col::len(time_cols)]
        small, large = column[0], column[-1]
        if len(column) > 1 and large.seconds <= small.seconds:
            raise LogError(f"{source}: the times do not grow with the message size: {large.nbytes} B on line "
                           f"{large.line} take {large.seconds:.3g} s, no longer than {small.nbytes} B on line "
                           f"{small.line} ({small.seconds:.3g} s); these are not one collective's timings")
    n = _ranks(rank_hosts, ranks, text, source)
    if n < 2:
        raise LogError(f"{source}: {n} rank: a collective of one GPU moves nothing over a link; the log calibrates "
                       "none (run it on 2 or more GPUs)")
    return CollectiveLog(source, n, len(set(rank_hosts.values())), _collective(bandwidths, n, collective, source),
                         tuple(timings), empty)


def _ranks(rank_hosts: dict[int, str], ranks: int | None, text: str, source: str) -> int:
    """The log's rank count: its ``Rank`` lines, or ``ranks`` (which must agree with them)."""
    if ranks is not None and not 1 <= ranks <= MAX_RANKS:
        raise LogError(f"--ranks {ranks}: must be between 1 and {MAX_RANKS}")
    if rank_hosts:
        found = len(rank_hosts)
        if ranks is not None and ranks != found:
            raise LogError(f"{source}: --ranks {ranks}, but the log's '#  Rank' lines name {found} ranks")
        return found
    if ranks is not None:
        return ranks
    m = _THREADS.search(text)
    said = f" (its header says nThread {m[1]} nGpus {m[2]} per process, not how many processes)" if m else ""
    raise LogError(f"{source}: no '#  Rank …' device lines, so the number of ranks is unknown{said}; give --ranks N")


def _collective(bandwidths: list[tuple[int, float, float]], n: int, said: str | None, source: str) -> str:
    """The collective whose busbw/algbw factor every row shows within the print's rounding
    (two decimals), or ``said`` when it agrees; one LogError otherwise."""
    if said is not None and said not in COLLECTIVES:
        raise LogError(f"--collective {said}: one of {', '.join(COLLECTIVES)}")

    def misfit(name: str) -> tuple[int, float, float] | None:
        f = bus_factor(name, n) if n > 1 else 0.0
        for line, alg, bus in bandwidths:
            if abs(bus - f * alg) > 0.005 * (1 + f) + 2e-3 * bus:
                return line, alg, bus
        return None

    fitting = [c for c in COLLECTIVES if misfit(c) is None]
    if said is not None:
        bad = misfit(said)
        if bad is not None:
            line, alg, bus = bad
            raise LogError(f"{source}: line {line}: busbw {bus:g} / algbw {alg:g} is not {said}'s "
                           f"{bus_factor(said, n):.4g} for {n} ranks: another collective, or another rank count")
        return said
    if len(fitting) == 1:
        return fitting[0]
    if not fitting:
        line, alg, bus = misfit("all_reduce") or (0, 0.0, 0.0)
        factors = ", ".join(f"{c} {bus_factor(c, n):.4g}" for c in COLLECTIVES)
        raise LogError(f"{source}: line {line}: busbw {bus:g} / algbw {alg:g} matches no collective's factor for "
                       f"{n} ranks ({factors}): is the rank count right (--ranks)?")
    raise LogError(f"{source}: the bandwidths are too small to tell all_reduce from all_gather; give --collective")


def read_nccl_tests(path: str | Path, ranks: int | None = None, collective: str | None = None) -> CollectiveLog:
    """:func:`parse_nccl_tests` of the file ``path`` (a regular file of at most LOG_MAX_BYTES)."""
    p = Path(path)
    try:
        data = read_bounded(p, LOG_MAX_BYTES, "nccl-tests log")
    except FileNotFoundError:
        raise LogError(f"{p}: no such nccl-tests log") from None
    except FileRefused as e:
        raise LogError(str(e)) from None
    except OSError as e:
        raise LogError(f"{p}: cannot read the nccl-tests log: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise LogError(f"{p}: not an nccl-tests log (not UTF-8 text at byte {e.start})") from None
    return parse_nccl_tests(text, str(p), ranks, collective)


def fit_log(log: CollectiveLog) -> Fit:
    """:func:`fit_alpha_beta` over every timing of ``log``."""
    return fit_alpha_beta(log.collective, log.ranks, [t.nbytes for t in log.timings],
                          [t.seconds for t in log.timings], [t.line for t in log.timings], log.source)


def network_keys(fit: Fit, scope: str) -> dict[str, float]:
    """The ``cluster.network`` keys a fit sets: ``inter`` (between nodes: ``latency_s = α``,
    ``bandwidth_Bps = β``, ``overhead_s = 0``, α holding the software cost too) or ``intra``
    (inside a node: ``intra_latency_s``, ``intra_bandwidth_Bps``)."""
    if scope == "inter":
        return {"latency_s": fit.alpha_s, "bandwidth_Bps": fit.beta_Bps, "overhead_s": 0.0}
    if scope == "intra":
        return {"intra_latency_s": fit.alpha_s, "intra_bandwidth_Bps": fit.beta_Bps}
    raise ValueError(f"scope {scope!r}: one of {', '.join(SCOPES)}")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile_text(fit: Fit, scope: str, source: str, described: str, hosts: int = 0) -> str:
    """The network profile of ``fit`` (TOML): the marker line, ``[network]`` (:func:`network_keys`,
    what a scenario takes) and ``[fit]`` (how it was obtained: for the reader, not applied)."""
    net = network_keys(fit, scope)
    lines = [f"{NETWORK_PROFILE_HEAD}: {described}",
             "# a scenario names this file as cluster.network.profile; keys the scenario sets itself win",
             "[network]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in net.items()]
    facts: dict[str, Any] = {
        "source": source, "collective": fit.collective, "ranks": fit.ranks, "hosts": hosts, "scope": scope,
        "alpha_s": fit.alpha_s, "beta_Bps": fit.beta_Bps, "timings": len(fit.residuals),
        "rms_relative_residual": fit.rms_residual, "max_relative_residual": fit.max_residual,
    }
    if fit.lines:
        facts["worst_line"] = fit.worst_line
    lines += ["", "[fit]"] + [f"{k} = {_toml_value(v)}" for k, v in facts.items()]
    return "\n".join(lines) + "\n"


def load_network_profile(path: str | Path) -> dict[str, float]:
    """The ``[network]`` keys of the profile ``path``: a non-empty table of :data:`NETWORK_KEYS`
    only, latencies finite in [0, 1e6] s, bandwidths ≥ 1 B/s (inf: free); one ProfileError line
    naming the file and the key otherwise."""
    if "\0" in str(path):
        raise ProfileError(f"{str(path)!r}: not a file name (it holds a NUL byte)")
    p = Path(path)
    data = read_profile_toml(p, "network profile")
    net = data.get("network")
    if not isinstance(net, dict) or not net:
        raise ProfileError(f"{p}: not a network profile (needs a [network] table of {', '.join(NETWORK_KEYS)}; "
                           "`ddlsim calibrate --nccl-tests LOG` or `--network` writes one)")
    out: dict[str, float] = {}
    for key, value in net.items():
        if key not in NETWORK_KEYS:
            raise ProfileError(f"{p}: key 'network.{key}': not a network profile key "
                               f"(one of {', '.join(NETWORK_KEYS)})")
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "…"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ProfileError(f"{p}: key 'network.{key}' = {shown}: must be a number")
        number = float(value)
        if key in LATENCY_KEYS and not 0 <= number <= MAX_LATENCY_S:
            raise ProfileError(f"{p}: key 'network.{key}' = {shown}: must be ≥ 0 and ≤ {MAX_LATENCY_S:g} s")
        if key in BANDWIDTH_KEYS and not number >= 1:
            raise ProfileError(f"{p}: key 'network.{key}' = {shown}: must be ≥ 1 B/s (inf: free)")
        out[key] = number
    return out


def apply_network_profile(point: dict[str, Any], explicit: frozenset[str]) -> None:
    """Set the point's ``cluster.network`` keys from its ``cluster.network.profile`` (if any),
    in place, except those the scenario sets itself (``explicit`` dotted keys)."""
    net = point["cluster"]["network"]
    if net.get("profile") is None:
        return
    for key, value in load_network_profile(net["profile"]).items():
        if f"cluster.network.{key}" not in explicit:
            net[key] = value


def without_profile_key(point: dict[str, Any]) -> dict[str, Any]:
    """``point`` (a copy of the tables it changes) without ``cluster.network.profile``: the
    profile's numbers are in the point once loaded, its file name is not simulated."""
    cluster = point.get("cluster")
    if not isinstance(cluster, dict):
        return point
    net = cluster.get("network")
    if not isinstance(net, dict) or "profile" not in net:
        return point
    return {**point, "cluster": {**cluster, "network": {k: v for k, v in net.items() if k != "profile"}}}


__all__ = ["NETWORK_PROFILE_HEAD", "COLLECTIVES", "SCOPES", "NETWORK_KEYS", "LogError", "Timing", "CollectiveLog",
           "Fit", "collective_time", "bus_factor", "fit_alpha_beta", "parse_nccl_tests", "read_nccl_tests", "fit_log",
           "network_keys", "profile_text", "load_network_profile", "apply_network_profile",
           "without_profile_key"]
