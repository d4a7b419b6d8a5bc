"""What each protocol is: its family, its update rule's parameters and its capabilities.

One :class:`ProtocolSpec` per protocol name is the only place a protocol is described;
the scenario schema takes its choices from :data:`SPECS`, the simulator picks its engine
by :attr:`ProtocolSpec.family`, and the live backend asks :func:`live_refusal` whether it
can run a point. A new parameter-server variant is one more entry here (its rule is a
combination of the :class:`~.ps.PSCore` mechanisms: the barrier, the every-``c`` apply
and the SSP release) plus, if it takes a new key, that key in the schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PS = "ps"
GOSSIP = "gossip"


@dataclass(frozen=True)
class ProtocolSpec:
    """A protocol: ``family`` ("ps" or "gossip") and, for the parameter-server family, how its
    server applies updates.

    * ``barrier``: an update waits for one gradient from every learner (hardsync);
    * ``per_update``: gradients per update: "all" (λ), "one" (1) or "n" (max(1, ⌊λ/n⌋));
    * ``bounded``: SSP's release rule with ``protocol.staleness_bound`` s (a learner may not
      start clock k while the slowest learner is below k − s);
    * ``uses_n``: the point's ``protocol.n`` matters (1 ≤ n ≤ λ is required);
    * ``softsync_n``: the n of Rudra's n-softsync it is, for the summary's ``softsync_n``
      column: "n" (the point's n), "learners" (λ: async) or "" (none);
    * ``live``: the live backend runs it; ``live_defaults``: keys the live backend supports
      only at these values.
    """

    name: str
    family: str
    doc: str
    barrier: bool = False
    per_update: str = "one"
    bounded: bool = False
    uses_n: bool = False
    softsync_n: str = ""
    live: bool = True
    live_defaults: tuple[tuple[str, Any], ...] = ()

    def gradients_per_update(self, learners: int, n: int) -> int:
        """c: the gradients one update averages."""
        if self.per_update == "all":
            return learners
        if self.per_update == "n":
            return max(1, learners // n)
        return 1

    def softsync_of(self, learners: int, n: int) -> int | None:
        """The n of Rudra's n-softsync this protocol is (None: it is not one)."""
        return {"n": n, "learners": learners}.get(self.softsync_n)


# the live parameter server is one process: no shards, no aggregators
_PS_LIVE = (("cluster.server.shards", 1), ("cluster.server.group_size", 1))

SPECS: dict[str, ProtocolSpec] = {s.name: s for s in (
    ProtocolSpec("hardsync", PS, "the server averages one gradient from every learner (a barrier)",
                 barrier=True, per_update="all", live_defaults=_PS_LIVE),
    ProtocolSpec("softsync", PS, "an update every max(1, ⌊λ/n⌋) gradients from any learners",
                 per_update="n", uses_n=True, softsync_n="n", live_defaults=_PS_LIVE),
    ProtocolSpec("async", PS, "an update per gradient (Downpour ASGD; softsync with n = λ)",
                 softsync_n="learners", live_defaults=_PS_LIVE),
    ProtocolSpec("ssp", PS, "an update per gradient; a learner waits while it is more than "
                 "staleness_bound clocks ahead of the slowest", bounded=True, live_defaults=_PS_LIVE),
    ProtocolSpec("bounded_softsync", PS, "n-softsync whose learners wait while they are more than "
                 "staleness_bound clocks ahead of the slowest (softsync + SSP's release rule)",
                 per_update="n", uses_n=True, softsync_n="n", bounded=True, live_defaults=_PS_LIVE),
    ProtocolSpec("allreduce", GOSSIP, "AR-SGD: every iteration a ring all-reduce of the gradients"),
    ProtocolSpec("dpsgd", GOSSIP, "D-PSGD: symmetric averaging with the neighbours, then the step"),
    ProtocolSpec("adpsgd", GOSSIP, "AD-PSGD: asynchronous pairwise averaging across a bipartition"),
    ProtocolSpec("sgp", GOSSIP, "Stochastic Gradient Push: PushSum over a time-varying directed graph"),
    ProtocolSpec("local_sgd", GOSSIP, "local SGD: H local steps on every node, then the models are averaged "
                 "(PyTorch's PeriodicModelAverager / post-local SGD)"),
    ProtocolSpec("diloco", GOSSIP, "DiLoCo: H inner steps on every node, then an outer Nesterov step on the "
                 "averaged pseudo-gradient (Douillard et al. 2023)"),
)}

PROTOCOLS: tuple[str, ...] = tuple(SPECS)
PS_PROTOCOLS: tuple[str, ...] = tuple(n for n, s in SPECS.items() if s.family == PS)
GOSSIP_PROTOCOLS: tuple[str, ...] = tuple(n for n, s in SPECS.items() if s.family == GOSSIP)


# the low-communication protocols (one engine: simulator/local_sgd.py) and those whose averaging
# protocol.compression may compress (the all-reduce ones)
LOCAL_PROTOCOLS: tuple[str, ...] = ("local_sgd", "diloco")
COMPRESSIBLE_PROTOCOLS: tuple[str, ...] = ("allreduce",) + LOCAL_PROTOCOLS

# Keys added to the schema after its first release, with their defaults: a point holding one
# at its default leaves it out of its hash and trace header (elide_late_defaults), so every
# earlier point keeps its run id and its trace byte for byte.
LATE_DEFAULTS: dict[str, Any] = {
    "protocol.local_steps": 1,
    "protocol.warmup_steps": 0,
    "protocol.outer_lr": 0.7,
    "protocol.outer_momentum": 0.9,
    "protocol.fragments": 1,
    "protocol.compression": "none",
    "protocol.powersgd_rank": 1,
    "protocol.powersgd_warmup": 0,
    "protocol.library": None,
    "cluster.server.aggregation": "none",
    "cluster.server.placement": "dedicated",
    "cluster.server.pull": "whole",
    "cluster.input.samples_per_s": None,
    "cluster.compute.multi_gpu_slowdown": None,
}


def elide_late_defaults(point: dict[str, Any]) -> dict[str, Any]:
    """``point`` (a copy of the tables it changes) without the :data:`LATE_DEFAULTS` keys that
    hold their default value, and without a table that leaves empty; a key set to anything
    else stays."""
    out = dict(point)
    for key, default in LATE_DEFAULTS.items():
        *path, leaf = key.split(".")
        node: Any = out
        for table in path:
            node = node.get(table) if isinstance(node, dict) else None
        if not (isinstance(node, dict) and leaf in node and node[leaf] == default
                and type(node[leaf]) is type(default)):
            continue
        chain, node = [], out
        for table in path:  # copy the path's tables: the caller's point is left as it is
            node[table] = dict(node[table])
            chain.append((node, table))
            node = node[table]
        del node[leaf]
        for parent, table in reversed(chain):
            if parent[table]:
                break
            del parent[table]
    return out


def spec_of(point: dict[str, Any]) -> ProtocolSpec:
    """The spec of a validated point's protocol."""
    return SPECS[point["protocol"]["name"]]


def is_ps(point: dict[str, Any]) -> bool:
    """The point's protocol is of the parameter-server family."""
    return SPECS[point["protocol"]["name"]].family == PS


def _dotted(point: dict[str, Any], key: str) -> Any:
    node: Any = point
    for part in key.split("."):
        node = node[part]
    return node


def live_refusal(point: dict[str, Any]) -> str | None:
    """Why the live backend cannot run ``point`` (one line), or None when it can."""
    spec = spec_of(point)
    if not spec.live:
        runs = ", ".join(n for n, s in SPECS.items() if s.live)
        return f"protocol {spec.name!r} has no live implementation (live runs {runs})"
    for key, value in spec.live_defaults:
        if _dotted(point, key) != value:
            return (f"{key} = {_dotted(point, key)}: live {spec.name} supports only {key} = {value} "
                    "(simulate it instead)")
    return None
