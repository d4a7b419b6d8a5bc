"""Read, validate and expand scenario files.

Rules kept here:

* every key is known to :mod:`schema` (an unknown key is refused, with a suggestion);
* every value has the key's type and range; cross-key rules (softsync n ≤ λ, a model
  that fits the data set) are checked on every expanded sweep point;
* ``[sweep]`` maps dotted keys to non-empty lists; points are the cartesian product in
  the order the axes are written; a ``--set`` of a swept key replaces that axis, and a
  ``--set`` whose value is a list on a scalar key becomes a sweep axis.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..simulator.catalog import SHAPED_MODELS, dataset_info, param_count, param_shapes
from ..simulator.collectives import default_algorithm
from ..simulator.compute import ProfileError, load_profile, magnitude
from ..simulator.network_profile import apply_network_profile, without_profile_key
from ..simulator.protocols import sim_id, spec_of
from ..simulator.protocols.catalog import COMPRESSIBLE_PROTOCOLS, elide_late_defaults
from ..simulator.protocols.local import max_overlap
from ..simulator.trace import SCHEMA_VERSION
from .hardware import apply_presets
from .schema import FIELD_BY_KEY, SECTIONS, ScenarioError, check_value, defaults, get_dotted, set_dotted

MAX_POINTS = 100_000
MAX_FILE_BYTES = 1 << 20


@dataclass
class Scenario:
    """A validated scenario: its base values, its sweep axes and where it came from."""

    path: str
    base: dict[str, Any]
    axes: list[tuple[str, list[Any]]]
    explicit: frozenset[str] = frozenset()  # keys the scenario sets itself (presets do not override them)
    # training samples in the files of a data set read from --data-dir (cli.common.check_data_sets):
    # an epoch is that many unless workload.samples_per_epoch is set, and it may not ask for more
    data_sizes: dict[str, int] = field(default_factory=dict)

    def points(self) -> list[dict[str, Any]]:
        """Every sweep point as a complete, validated nested dict (with derived keys)."""
        return expand(self)


def fmt_value(value: Any) -> str:
    """A value as a message shows it, on one short line: an integer of any size by its magnitude
    (never its thousands of digits), a long string or list cut short."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        if abs(value) == _TOO_LONG:
            return f"an integer of more than {sys.get_int_max_str_digits():,} digits"
        return magnitude(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 80 else f"{value[:60]!r}… ({len(value):,} characters)"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, list):
        items = [fmt_value(v) if not isinstance(v, str) else json.dumps(v) for v in value[:8]]
        return "[" + ", ".join(items) + (f", … ({len(value):,} values)" if len(value) > 8 else "") + "]"
    return str(value)


# An integer literal longer than Python converts (sys.get_int_max_str_digits(), 4,300 by default)
# is read as ±_TOO_LONG: out of every key's range, so the key's own check refuses it with its range.
_TOO_LONG = 10**600 + 1  # 601 digits: convertible under any limit Python allows (≥ 640)
_INT_LITERAL = re.compile(r"(?<![\w.])([+-]?)(\d(?:_?\d)*)(?![\w.])")


def _too_long_ints(text: str) -> str:
    """``text`` with every integer literal of more digits than Python converts replaced by ±_TOO_LONG."""
    limit = sys.get_int_max_str_digits() or math.inf

    def sub(m: re.Match[str]) -> str:
        digits = m.group(2).replace("_", "")
        return f"{m.group(1)}{_TOO_LONG}" if len(digits) > limit else m.group(0)

    return _INT_LITERAL.sub(sub, text)


def _toml(text: str) -> tuple[dict[str, Any], bool]:
    """``(tomllib.loads(text), False)``; an integer too long for Python reads as ±_TOO_LONG,
    ``(…, True)``: the caller refuses the key that holds it. TOML errors propagate."""
    try:
        return tomllib.loads(text), False
    except tomllib.TOMLDecodeError:
        raise
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        return tomllib.loads(_too_long_ints(text)), True


def _flatten(table: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key in SECTIONS:
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _unknown(where: str, key: str) -> ScenarioError:
    known = list(FIELD_BY_KEY) + sorted(SECTIONS)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ScenarioError(f"{where}: unknown key '{key}'{hint}")


def _validated(where: str, key: str, value: Any) -> Any:
    f = FIELD_BY_KEY.get(key)
    if f is None:
        if key in SECTIONS:
            raise ScenarioError(f"{where}: '{key}' is a table, not a value: set its keys, "
                                f"e.g. '{next(k for k in FIELD_BY_KEY if k.startswith(key + '.'))}'")
        raise _unknown(where, key)
    if isinstance(value, dict):
        raise ScenarioError(f"{where}: key '{key}' = table: expected a {f.kind}")
    value, problem = check_value(f, value)
    if problem:
        raise ScenarioError(f"{where}: key '{key}' = {fmt_value(value)}: {problem}")
    return value


TOML_OPENERS = ("[", "{", '"', "'")  # a --set value that starts so is meant as TOML, never a bare string


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value``; the value is read as TOML, or as a bare string. A value that starts
    like a TOML array, inline table or quoted string must parse as one (else it is refused as
    malformed, not taken for a string)."""
    if "=" not in text:
        raise ScenarioError(f"--set {text!r}: expected key=value")
    key, raw = (s.strip() for s in text.split("=", 1))
    if not key:
        raise ScenarioError(f"--set {text!r}: empty key")
    try:
        value = _toml(f"v = {raw}")[0]["v"]
    except tomllib.TOMLDecodeError as e:
        if raw.startswith(TOML_OPENERS):
            shown = raw if len(raw) <= 60 else raw[:57] + "…"
            reason = str(e).replace("(at line 1, column", "(at column").replace("(at end of document)", "(at its end)")
            raise ScenarioError(f"--set {key}: malformed TOML value {shown!r}: {reason}") from None
        value = raw
    except RecursionError:
        raise ScenarioError(f"--set {key}: malformed TOML value: arrays or tables nested too deeply") from None
    return key, value


def load_text(text: str, path: str = "<scenario>", overrides: list[str] | None = None,
              folder: Path | None = None) -> Scenario:
    """Validate scenario TOML ``text`` (``path`` names it in messages) with overrides.

    Relative profile paths are resolved against ``folder`` (default: the working directory).
    """
    try:
        raw, too_long = _toml(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise ScenarioError(f"{path}: invalid TOML: arrays or tables nested too deeply") from None
    base = defaults()
    axes: dict[str, list[Any]] = {}
    sweep = raw.pop("sweep", {})
    if not isinstance(sweep, dict):
        raise ScenarioError(f"{path}: key 'sweep' must be a table of dotted keys to lists")
    explicit: set[str] = set()
    for key, value in _flatten(raw):
        if key in explicit:  # e.g. "cluster.learners" = 8 beside [cluster] learners = 4
            raise ScenarioError(f"{path}: key '{key}' is set twice (as a dotted name and in its table)")
        set_dotted(base, key, _validated(path, key, value))
        explicit.add(key)
    raw_axes: dict[str, tuple[str, list[Any]]] = {}  # key → (where, values): validated once counted
    for key, values in sweep.items():
        where = f"{path}: [sweep]"
        if key not in FIELD_BY_KEY:
            raise _unknown(where, key)
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"{where} key '{key}' = {fmt_value(values)}: expected a non-empty array")
        raw_axes[key] = (f"{path}: [sweep] '{key}'", values)
        explicit.add(key)
    for text_kv in overrides or []:
        key, value = parse_override(text_kv)
        where = f"--set {key}"
        if key.startswith("sweep."):
            key = key[len("sweep."):]
            value = value if isinstance(value, list) else [value]
        f = FIELD_BY_KEY.get(key)
        if f is None:
            _validated("--set", key, value)  # says what is wrong with the key
        assert f is not None  # an unknown key was refused just above
        explicit.add(key)
        if isinstance(value, list) and f.kind != "list":
            if not value:
                raise ScenarioError(f"{where} = []: expected a non-empty array")
            raw_axes[key] = (where, value)  # replaces the file's axis of that key, in its place
        else:
            raw_axes.pop(key, None)
            set_dotted(base, key, _validated(where, key, value))
    size = math.prod(len(values) for _, values in raw_axes.values())  # counted before any value is checked
    if size > MAX_POINTS:
        raise ScenarioError(f"{path}: the sweep has {size:,} points (more than {MAX_POINTS:,}); "
                            "split it into several scenarios")
    if "replicates" in raw_axes:
        where, values = raw_axes["replicates"]
        raise ScenarioError(f"{where}: key 'replicates' = {fmt_value(values)}: cannot be swept (it is how many seeds "
                            "every configuration runs with); set one number")
    for key, (where, values) in raw_axes.items():
        axes[key] = _axis(where, key, values)
    _check_seeds(path, base, dict(axes))
    if too_long:  # every key refuses ±_TOO_LONG; this is only the backstop
        raise ScenarioError(f"{path}: an integer of more than {sys.get_int_max_str_digits():,} digits")
    scenario = Scenario(path, base, list(axes.items()), frozenset(explicit))
    _resolve_profile(scenario, folder or Path.cwd())
    scenario.points()  # validate every point now, so errors come before any work
    return scenario


def _check_seeds(path: str, base: dict[str, Any], axes: dict[str, list[Any]]) -> None:
    """``replicates`` runs seeds ``seed … seed + replicates − 1`` of every configuration: the last
    must be a seed (≤ the key's maximum), and a swept ``seed`` may not make two points one run."""
    reps = base["replicates"]
    seeds = axes.get("seed", [base["seed"]])
    top = FIELD_BY_KEY["seed"].maximum
    assert top is not None  # the schema bounds the seed
    if max(seeds) + reps - 1 > top:
        raise ScenarioError(f"{path}: key 'replicates' = {reps}: seed {max(seeds):,} + {reps - 1} is beyond the "
                            f"largest seed ({int(top):,})")
    if reps > 1 and len(seeds) > 1:
        runs = sorted(s + r for s in seeds for r in range(reps))
        twice = next((a for a, b in zip(runs, runs[1:]) if a == b), None)
        if twice is not None:
            raise ScenarioError(f"{path}: key 'replicates' = {reps} with seed swept over {fmt_value(seeds)}: seed "
                                f"{fmt_value(twice)} would run twice; space the seeds at least {reps} apart")


def _frozen(value: Any) -> Any:
    """A hashable stand-in equal exactly when ``value`` is (lists become tuples)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _axis(where: str, key: str, values: list[Any]) -> list[Any]:
    """A validated sweep axis; a value listed twice would make two identical runs (found in
    one pass over a set, whatever the axis' length)."""
    out = [_validated(where, key, v) for v in values]
    seen: set[Any] = set()
    for v in out:
        frozen = _frozen(v)
        if frozen in seen:
            raise ScenarioError(f"{where}: key '{key}' lists {fmt_value(v)} twice")
        seen.add(frozen)
    return out


def load(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read and validate the scenario file at ``path``."""
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():
        raise ScenarioError(f"{p}: not a regular file")
    if p.is_file() and p.stat().st_size > MAX_FILE_BYTES:
        raise ScenarioError(f"{p}: {p.stat().st_size:,} bytes is too large for a scenario file")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark is accepted
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{p}: is a directory, not a scenario file") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{p}: not a UTF-8 text file") from None
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read: {e.strerror}") from None
    if not text.strip():
        raise ScenarioError(f"{p}: the scenario file is empty; start from a bundled one: "
                            "ddlsim scenarios --show demo > my.toml")
    return load_text(text, str(p), overrides, p.parent)


def _resolve_profile(scenario: Scenario, folder: Path) -> None:
    for table in ("compute", "network"):
        prof = scenario.base["cluster"][table]["profile"]
        if prof is not None and not Path(prof).is_absolute():
            scenario.base["cluster"][table]["profile"] = str((folder / prof).resolve())
    for key, values in scenario.axes:
        if key in ("cluster.compute.profile", "cluster.network.profile"):
            values[:] = [v if Path(v).is_absolute() else str((folder / v).resolve()) for v in values]


def _check_point(path: str, point: dict[str, Any], label: str, explicit: frozenset[str],
                 data_sizes: dict[str, int] | None = None) -> None:
    apply_presets(point, explicit, path, label)
    try:  # after the presets: a profile's measured numbers replace theirs; explicit keys win over both
        apply_network_profile(point, explicit)
    except ProfileError as e:
        raise ScenarioError(f"{path}: key 'cluster.network.profile' = {point['cluster']['network']['profile']!r}"
                            f"{label}: {e}") from None
    lam = point["cluster"]["learners"]
    proto = point["protocol"]
    if spec_of(point).uses_n and not 1 <= proto["n"] <= lam:
        raise ScenarioError(
            f"{path}: key 'protocol.n' = {proto['n']}{label}: {proto['name']} needs 1 ≤ n ≤ learners ({lam})")
    wl = point["workload"]
    try:
        info = dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"])
        count = param_count(wl["model"], info)
    except ValueError as e:
        raise ScenarioError(f"{path}: key 'workload.model' = {wl['model']!r}{label}: {e}") from None
    found = (data_sizes or {}).get(wl["dataset"])
    if wl["samples_per_epoch"] is None:
        wl["samples_per_epoch"] = info.train_size if found is None else found
    elif found is not None and wl["samples_per_epoch"] > found:
        raise ScenarioError(
            f"{path}: key 'workload.samples_per_epoch' = {wl['samples_per_epoch']}{label}: more than the {found:,} "
            f"training samples of data set {wl['dataset']!r} in --data-dir; lower it, or leave it out and an epoch "
            f"is the {found:,}")
    if wl["param_count"] is None:
        wl["param_count"] = count
    profile = point["cluster"]["compute"]["profile"]
    if profile is not None:
        try:
            load_profile(profile)
        except ProfileError as e:
            raise ScenarioError(f"{path}: key 'cluster.compute.profile' = {profile!r}{label}: {e}") from None
    g = point["cluster"]["gpus_per_node"]
    if lam % g:
        raise ScenarioError(f"{path}: key 'cluster.gpus_per_node' = {g}{label}: learners ({lam}) must be a multiple "
                            "of it (one learner per GPU)")
    if proto["allreduce_algorithm"] is None:
        proto["allreduce_algorithm"] = default_algorithm(g)
    if proto["overlap"] and proto["name"] not in OVERLAP_PROTOCOLS:
        raise ScenarioError(f"{path}: key 'protocol.overlap' = {proto['overlap']}{label}: protocol "
                            f"{proto['name']!r} does not overlap (the key applies to {', '.join(OVERLAP_PROTOCOLS)})")
    pull = point["cluster"]["server"].get("pull", "whole")
    if pull != "whole" and spec_of(point).family != "ps":
        raise ScenarioError(f"{path}: key 'cluster.server.pull' = {pull!r}{label}: protocol {proto['name']!r} has "
                            "no parameter server to pull from")
    if pull == "replicated" and (proto["name"] != "hardsync" or point["cluster"]["server"]["group_size"] > 1):
        what = f"protocol.name = {proto['name']!r}" if proto["name"] != "hardsync" else "cluster.server.group_size > 1"
        via = "" if "cluster.server.pull" in explicit else f" (set by protocol.library {proto.get('library')!r})"
        raise ScenarioError(f"{path}: key 'cluster.server.pull' = 'replicated'{via}{label}: a synchronous step with "
                            f"a barrier per piece; needs protocol.name = 'hardsync' without aggregators, not {what}")
    if proto["name"] == "dpsgd" and proto["overlap"] > 1:
        raise ScenarioError(f"{path}: key 'protocol.overlap' = {proto['overlap']}{label}: dpsgd takes 0 (exchange "
                            "after the step, blocking) or 1 (exchange while computing)")
    _check_low_communication(path, point, label)
    fail = point["live"]["fail_learner"]
    if fail >= lam:
        raise ScenarioError(f"{path}: key 'live.fail_learner' = {fail}{label}: must be < learners ({lam}) or -1")
    group = point["cluster"]["server"]["group_size"]
    if group > lam:
        raise ScenarioError(
            f"{path}: key 'cluster.server.group_size' = {group}{label}: must be ≤ learners ({lam})")


# the protocols protocol.overlap means something to (sgp's τ, dpsgd's schedule, streaming DiLoCo's τ)
OVERLAP_PROTOCOLS = ("sgp", "dpsgd", "diloco")


def _check_low_communication(path: str, point: dict[str, Any], label: str) -> None:
    """Compression only where the protocol all-reduces; fragments only for diloco, at most
    H of them and at most the model's tensors; PowerSGD only for a model whose tensor
    shapes are known (:func:`..simulator.catalog.param_shapes`)."""
    proto, wl = point["protocol"], point["workload"]
    name, comp = proto["name"], proto["compression"]
    if comp != "none" and name not in COMPRESSIBLE_PROTOCOLS:
        raise ScenarioError(f"{path}: key 'protocol.compression' = {comp!r}{label}: protocol {name!r} has no "
                            f"all-reduce to compress (compression applies to {', '.join(COMPRESSIBLE_PROTOCOLS)})")
    if proto["fragments"] > 1:
        if name != "diloco":
            raise ScenarioError(f"{path}: key 'protocol.fragments' = {proto['fragments']}{label}: fragments are "
                                f"streaming DiLoCo's (protocol.name = \"diloco\"), not {name}'s")
        if proto["fragments"] > proto["local_steps"]:
            raise ScenarioError(f"{path}: key 'protocol.fragments' = {proto['fragments']}{label}: at most "
                                f"protocol.local_steps ({proto['local_steps']}) fragments, one synchronised every "
                                "H/F inner steps")
    if name == "diloco" and proto["overlap"] > max_overlap(proto["local_steps"], proto["fragments"]):
        raise ScenarioError(f"{path}: key 'protocol.overlap' = {proto['overlap']}{label}: diloco overlaps a "
                            f"fragment's averaging with at most H/F − 1 = "
                            f"{max_overlap(proto['local_steps'], proto['fragments'])} inner steps "
                            f"(protocol.local_steps = {proto['local_steps']}, protocol.fragments = "
                            f"{proto['fragments']})")
    if comp == "powersgd" or proto["fragments"] > 1:
        info = dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"])
        shapes = param_shapes(wl["model"], info)
        key, value = ("protocol.compression", repr(comp)) if comp == "powersgd" else \
            ("protocol.fragments", str(proto["fragments"]))
        if shapes is None:
            raise ScenarioError(f"{path}: key '{key}' = {value}{label}: needs the tensor shapes of model "
                                f"{wl['model']!r}, which ddlsim does not know (known: {', '.join(SHAPED_MODELS)})")
        if proto["fragments"] > len(shapes):
            raise ScenarioError(f"{path}: key 'protocol.fragments' = {proto['fragments']}{label}: model "
                                f"{wl['model']!r} has only {len(shapes)} tensors to split into fragments")


def _tree_copy(value: Any) -> Any:
    """A copy of a tree of tables and arrays (all a scenario holds), shared by nothing: what
    ``copy.deepcopy`` gives, several times faster on a 100,000-point sweep."""
    if isinstance(value, dict):
        return {k: _tree_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree_copy(v) for v in value]
    return value


def expand(scenario: Scenario) -> list[dict[str, Any]]:
    """Cartesian product of the sweep axes over the base values, each combination (a
    configuration) ``replicates`` times with seeds ``seed, seed + 1, …`` (adjacent in the
    list). A point is one run: it holds its own ``seed`` (so its hash and run id differ from
    its replicates') and ``_replicate`` (0, 1, …); its ``replicates`` is the sweep's, left out
    of its hash (:func:`point_hash`) and of the simulation."""
    keys = [k for k, _ in scenario.axes]
    reps = int(scenario.base.get("replicates", 1))
    out = []
    for combo in itertools.product(*(v for _, v in scenario.axes)):
        point = _tree_copy(scenario.base)
        for k, v in zip(keys, combo):
            set_dotted(point, k, _tree_copy(v))
        label = "".join(f", {k}={fmt_value(v)}" for k, v in zip(keys, combo))
        _check_point(scenario.path, point, f" (at sweep point{label[1:]})" if label else "", scenario.explicit,
                     scenario.data_sizes)
        first = point["seed"]
        for r in range(reps):
            run = point if r == reps - 1 else _tree_copy(point)
            run["seed"] = first + r
            run["_replicate"] = r
            run["_swept"] = {k: v for k, v in zip(keys, combo)}
            run["_id"] = run_id(run)
            out.append(run)
    return out


def check_engine(points: list[dict[str, Any]], engine: str) -> None:
    """Refuse, before any run, ``--engine fast`` for a point no fast engine simulates exactly
    (:func:`..simulator.run.fast_engine` says why: the local protocols' one engine, a
    layer-wise pull, what a fast engine does not cover)."""
    if engine != "fast":
        return
    from ..simulator.run import fast_engine  # loads numba: only for --engine fast

    for point in points:
        fast, reason = fast_engine(point)
        if fast is None:
            raise ScenarioError(f"--engine fast (point {point['_id']}): {reason}; use --engine auto or simpy")


def point_hash(point: dict[str, Any]) -> str:
    """Stable hash of a point's values and the trace schema version (a new trace schema makes
    every stored result stale, so ``--resume`` recomputes it); ``replicates`` is not the run's
    (a run of seed 3 is the same whether its sweep has 1 replicate or 5)."""
    clean = elide_late_defaults({k: v for k, v in without_profile_key(point).items()
                                 if not k.startswith("_") and k != "replicates"})
    blob = json.dumps({"v": SCHEMA_VERSION, "p": clean}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def configuration_id(point: dict[str, Any]) -> str:
    """The id of a point's configuration, shared by its replicates (the point without its seed):
    protocol, learners, minibatch and a hash of the rest."""
    rest = {k: v for k, v in point.items() if k != "seed"}
    head = run_id(point).rsplit("-", 1)[0]
    return f"{head}-{point_hash(rest)[:8]}"


def simulation_key(point: dict[str, Any]) -> str:
    """Points with the same key give the same simulation (the simulator ignores the optimizer,
    the backend, the live keys, the target error and the names)."""
    return sim_id(point)


def run_id(point: dict[str, Any]) -> str:
    """Readable unique id: protocol, learners, minibatch and a hash of the point."""
    p = point["protocol"]["name"]
    if spec_of(point).uses_n:
        p += str(point["protocol"]["n"])
    c = point["cluster"]
    return f"{p}-l{c['learners']}-m{c['minibatch']}-{point_hash(point)[:8]}"


def recorded_point(where: str, tree: Any) -> dict[str, Any]:
    """The scenario point a trace records, validated as a scenario file's keys are (each key
    known, of its type and range; the cross-key rules), the keys it lacks at their defaults;
    its [workload] and [optimizer] tables, what the replay trains with, must be there."""
    for table in ("workload", "optimizer"):
        if not isinstance(tree, dict) or not isinstance(tree.get(table), dict):
            raise ScenarioError(f"{where}: lacks the [{table}] table; pass --scenario FILE [--point N]")
    base, keys = defaults(), set()
    for key, value in _flatten(tree):
        f = FIELD_BY_KEY.get(key)
        if f is not None and f.kind == "float" and value in ("inf", "-inf", "nan"):
            value = float(value)  # strict JSON spells a non-finite number so (docs/trace.md)
        set_dotted(base, key, _validated(where, key, value))
        keys.add(key)
    return Scenario(where, base, [], frozenset(keys)).points()[0]


__all__ = ["Scenario", "ScenarioError", "load", "load_text", "expand", "parse_override", "run_id", "check_engine",
           "point_hash", "configuration_id", "get_dotted", "recorded_point"]
