"""The scenario schema: every public key, its type, unit, default and range.

The schema is data (``FIELDS``) so that validation, defaults and the reference in
``docs/scenarios.md`` all come from one place. A validated scenario *point* is a plain
nested ``dict`` with every key present; the simulator and backends read it directly.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from typing import Any

from ..simulator.catalog import DATASETS, MODELS
from ..simulator.collectives import ALGORITHMS
from ..simulator.compute import MAX_MINIBATCH
from ..simulator.compression_bytes import COMPRESSIONS
from ..simulator.protocols import PROTOCOLS
from ..simulator.protocols.catalog import LATE_DEFAULTS
from ..simulator.topology import TOPOLOGIES


class ScenarioError(ValueError):
    """Bad scenario input; the message is one line naming file, key and value."""


@dataclass(frozen=True)
class Field:
    """One scenario key: ``kind`` is bool/int/float/str/list; ``check`` refines the range."""

    key: str
    kind: str
    default: Any
    doc: str
    unit: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False
    allow_inf: bool = False
    optional: bool = False  # default None means "derived" (documented in doc)
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)

    def range_text(self) -> str:
        """A human description of the accepted values."""
        if self.choices:
            return " | ".join(self.choices)
        lo = "" if self.minimum is None else f"{'>' if self.min_exclusive else '≥'} {self.minimum:g}"
        hi = "" if self.maximum is None else f"{'<' if self.max_exclusive else '≤'} {self.maximum:g}"
        parts = [p for p in (lo, hi) if p]
        text = ", ".join(parts)
        if self.allow_inf:
            text += (", " if text else "") + "inf allowed"
        return text or "any"




MILESTONE_EPOCH = Field("optimizer.milestones epoch", "float", 0.0, "", minimum=0, maximum=1e6)
MILESTONE_FACTOR = Field("optimizer.milestones factor", "float", 1.0, "", minimum=0, min_exclusive=True,
                         maximum=1e30)


def _check_milestones(value: Any) -> str | None:
    """Each milestone is ``[epoch, factor]``, both in their fields' ranges (the one range check)."""
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            return "each milestone must be [epoch, factor]"
        for part, x in zip((MILESTONE_EPOCH, MILESTONE_FACTOR), item):
            _, problem = check_value(part, x)
            if problem:
                return f"{part.key.split()[-1]} of a milestone: {problem}"
    return None


ADAM_BETA = Field("optimizer.betas item", "float", 0.9, "", minimum=0, maximum=1, max_exclusive=True)


def _check_betas(value: Any) -> str | None:
    """Adam's ``[β1, β2]``: two numbers, each ≥ 0 and < 1 (the one range check)."""
    if len(value) != 2:
        return "expected two numbers [β1, β2]"
    for name, x in zip(("β1", "β2"), value):
        _, problem = check_value(ADAM_BETA, x)
        if problem:
            return f"{name}: {problem}"
    return None


def _check_path(value: Any) -> str | None:
    """A file path names a file: no NUL byte (no file system accepts one), not empty."""
    if "\0" in value:
        return "a path may not contain a NUL byte"
    return None if value.strip() else "an empty path names no file"


def did_you_mean(name: str, names: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest name, or an empty string."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _check_host(value: Any) -> str | None:
    """An IP address, or a host name of RFC 1123 labels; a name of digits only must be an IPv4 address."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    labels = value.split(".")
    if not value or len(value) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return "not an IP address or a host name"
    if all(label.isdigit() for label in labels):
        return "not an IPv4 address (each of its four parts 0-255) or a host name"
    return None


def _f(key: str, default: float | None, doc: str, unit: str = "", **kw: Any) -> Field:
    return Field(key, "float", default, doc, unit, **kw)


def _i(key: str, default: int | None, doc: str, unit: str = "", **kw: Any) -> Field:
    return Field(key, "int", default, doc, unit, **kw)


def _s(key: str, default: str | None, doc: str, **kw: Any) -> Field:
    return Field(key, "str", default, doc, **kw)


FIELDS: tuple[Field, ...] = (
    _s("name", "scenario", "Scenario name, used in reports."),
    _s("description", "", "Free text shown by `ddlsim scenarios`."),
    _i("seed", 0, "Seed for every random draw (compute, stragglers, data order, init).", minimum=0,
       maximum=2**63 - 1),
    _i("replicates", 1, "Runs of every configuration, with seeds seed, seed + 1, …: compute draws, data order and "
       "initial weights all change (configurations.csv gives their mean and spread).", minimum=1, maximum=100),
    _s("backend", "replay", "Backend that executes the trace: replay | live | an entry point's name."),
    # workload
    _s("workload.dataset", "digits", "Training data set.", choices=DATASETS),
    _s("workload.model", "mlp", "Model architecture.", choices=MODELS),
    _f("workload.epochs", 20.0, "Passes over the training set.", "epochs", minimum=0, min_exclusive=True,
       maximum=1e6),
    _i("workload.samples_per_epoch", None,
       "Samples per epoch; default: the data set's training size.", "samples", minimum=1, maximum=10**10,
       optional=True),
    _i("workload.param_count", None,
       "Parameters of the model; default: counted from the model (table of known models).",
       "parameters", minimum=1, maximum=10**13, optional=True),
    _f("workload.target_error", 0.10, "Test error that defines time-to-target.", "fraction",
       minimum=0, maximum=1),
    _i("workload.evals_per_epoch", 1, "Evaluations of the test error per epoch.", minimum=1, maximum=1000),
    _i("workload.final_evals", 3, "final_test_error is the mean of this many last evaluations (the one before "
       "training excluded; fewer when the run has fewer).", minimum=1, maximum=10**6),
    _i("workload.teacher_samples", 4096, "Training size of the synthetic `teacher` data set.",
       "samples", minimum=16, maximum=10**8),
    _i("workload.teacher_features", 32, "Input features of the synthetic `teacher` data set.", minimum=1,
       maximum=10**6),
    # optimizer
    _s("optimizer.name", "sgd", "Update rule (torch.optim's SGD, SGD with Nesterov momentum, Adagrad, Adam, "
       "AdamW).", choices=("sgd", "nesterov", "adagrad", "adam", "adamw")),
    _f("optimizer.lr", 0.05, "Base learning rate α0.", minimum=0, min_exclusive=True, maximum=1e30),
    _f("optimizer.momentum", 0.9, "Momentum coefficient (sgd, nesterov).", minimum=0, maximum=1,
       max_exclusive=True),
    _f("optimizer.weight_decay", 0.0, "L2 weight decay (adamw: decoupled, the weights decay by lr·wd).",
       minimum=0, maximum=1e6),
    _s("optimizer.lr_policy", "constant", "Staleness handling, on the step's learning rate: α0, α0/⟨σ⟩ or "
       "α0/σ_i (docs/replay.md).", choices=("constant", "mean_staleness", "per_gradient")),
    Field("optimizer.betas", "list", [0.9, 0.999], "Adam's moment decay rates [β1, β2] (adam, adamw).",
          check=_check_betas),
    _f("optimizer.eps", None, "Term added to the denominator (adam, adamw, adagrad); default 1e-8 for "
       "adam and adamw, 1e-10 for adagrad.", minimum=0, min_exclusive=True, maximum=1, optional=True),
    Field("optimizer.milestones", "list", [], "Learning-rate decay: list of [epoch, factor].",
          "epochs", check=_check_milestones),
    _f("optimizer.warmup_epochs", 0.0, "Linear learning-rate warm-up length.", "epochs", minimum=0,
       maximum=1e6),
    # cluster
    _i("cluster.learners", 8, "λ learners (parameter server) or N nodes (decentralized).", minimum=1,
       maximum=100_000),
    _i("cluster.minibatch", 16, "μ samples per learner per gradient.", "samples", minimum=1,
       maximum=MAX_MINIBATCH),
    _i("cluster.gpus_per_node", 1, "Learners (one per GPU) that share a node and its NIC; learners must be a "
       "multiple of it.", minimum=1, maximum=1024),
    _s("cluster.gpu", None, "Hardware preset (`ddlsim hardware`): fills cluster.compute.base_s/per_sample_s from "
       "the GPU's published throughput for the model, the intra-node link and the GPU's multi-GPU slowdown where it "
       "has one (k80); explicit keys win.", optional=True),
    _s("cluster.precision", "fp32", "Precision of the GPU preset's throughput.", choices=("fp32", "mixed")),
    _s("cluster.compute.distribution", "lognormal", "Distribution of compute time around its mean.",
       choices=("deterministic", "exponential", "lognormal")),
    _f("cluster.compute.base_s", 0.002, "Fixed compute time per minibatch.", "s", minimum=0, maximum=1e6),
    _f("cluster.compute.per_sample_s", 0.0005, "Compute time per sample.", "s", minimum=0, maximum=1e6),
    _f("cluster.compute.multi_gpu_slowdown", None, "Each GPU's compute slower by this share (0.05: 5 %) whenever a "
       "node runs more than one GPU: base_s += the share × the minibatch's compute time; default: the cluster.gpu "
       "preset's figure (k80: 0.0339, calibrated; docs/hardware.md), none without one; 0 turns it off. It applies "
       "to an explicit base_s too (a library's figures for base_s give way to one), has no effect with one GPU per "
       "node, multiplies with a library's overlap_slowdown; a compute profile replaces the compute model, and it "
       "with it.", "share",
       minimum=0, maximum=1, max_exclusive=True, optional=True),
    _f("cluster.compute.cv", 0.1, "Coefficient of variation (lognormal).", minimum=0, maximum=10),
    _f("cluster.compute.backward_fraction", 2 / 3, "Share of a minibatch's compute spent in backward (gradient "
       "buckets are produced during it).", "fraction", minimum=0, min_exclusive=True, maximum=1),
    _f("cluster.compute.step_s", 0.0, "Optimizer step per iteration after the last bucket (all-reduce family).", "s",
       minimum=0, maximum=1e6),
    _s("cluster.compute.profile", None,
       "Calibrated table (TOML) of minibatch → seconds; replaces base_s/per_sample_s. "
       "Relative paths are relative to the scenario file.", optional=True, check=_check_path),
    _f("cluster.stragglers.fraction", 0.0, "Fraction of learners that are persistently slow.",
       "fraction", minimum=0, maximum=1),
    _f("cluster.stragglers.slowdown", 1.0, "Compute-time factor of a persistent straggler.", minimum=1,
       maximum=1e6),
    _f("cluster.stragglers.stall_rate_per_s", 0.0, "Transient stalls per learner per second (Poisson).",
       "1/s", minimum=0, maximum=1e6),
    _f("cluster.stragglers.stall_mean_s", 0.0, "Mean stall duration (exponential).", "s", minimum=0,
       maximum=1e6),
    _s("cluster.network.preset", None, "Network preset (`ddlsim hardware`): fills latency_s, bandwidth_Bps and "
       "overhead_s; explicit keys win.", optional=True),
    _s("cluster.network.profile", None, "Network profile (TOML; `ddlsim calibrate --nccl-tests LOG` or `--network` "
       "writes one): its [network] keys replace the preset's; explicit keys win. Relative paths are relative to the "
       "scenario file (docs/network-calibration.md).", optional=True, check=_check_path),
    _f("cluster.network.latency_s", 5e-5, "Per-message latency between nodes.", "s", minimum=0, maximum=1e6),
    _f("cluster.network.bandwidth_Bps", 1.25e9, "Link bandwidth; inf means transfers are free.",
       "bytes/s", minimum=1, allow_inf=True),
    _f("cluster.network.overhead_s", 0.0, "Fixed software cost of every message (a collective pays it per step), "
       "beside the wire latency.", "s", minimum=0, maximum=1e6),
    _f("cluster.network.intra_bandwidth_Bps", 1.6e10, "Per-GPU link inside a node (default: PCIe 3.0 x16); inf "
       "means free.", "bytes/s", minimum=1, allow_inf=True),
    _f("cluster.network.intra_latency_s", 5e-6, "Per-message latency inside a node.", "s", minimum=0, maximum=1e6),
    _f("cluster.network.bytes_per_param", 4.0, "Bytes per parameter in a message.", "bytes", minimum=0,
       min_exclusive=True, maximum=1024),
    _i("cluster.server.shards", 1, "Parameter-server shards (each its own NIC and apply queue).",
       minimum=1, maximum=1024),
    _f("cluster.server.apply_s", 1e-4, "Server time to process one gradient (per shard).", "s", minimum=0,
       maximum=1e6),
    _s("cluster.server.apply_distribution", "deterministic", "Distribution of apply time.",
       choices=("deterministic", "exponential")),
    _i("cluster.server.group_size", 1,
       "Tree aggregation (Rudra-adv): learners per aggregator; 1 disables it.", minimum=1, maximum=100_000),
    _s("cluster.server.aggregation", "none", "machine: the GPUs of a machine sum their gradients over the intra-node "
       "link before one push per machine (TensorFlow's replicated variables, MXNet's local kvstore; hardsync; the "
       "simulated learners are then the machines, docs/scenarios.md).", choices=("none", "machine")),
    _s("cluster.server.pull", "whole", "layerwise: a learner receives the weights in pieces in forward order (a "
       "piece per layer, its forward share its share of the multiply-adds, for the models whose layers the catalogue "
       "knows: resnet50/101/152, vgg16, inception_v3, alexnet; else protocol.bucket_bytes pieces with the forward "
       "spread over the bytes) and computes each piece's share of the forward pass once it has arrived (TensorFlow "
       "reads each variable from its parameter server as the forward needs it); parameter-server protocols only; "
       "whole: the forward starts after the whole "
       "model has arrived; layerwise-random: layerwise, each pull sending the pieces in a random order of its own "
       "(TensorFlow 1.x leaves its transfers unordered); layerwise-shared: layerwise, every piece's transfer "
       "starting at once and the pieces in flight sharing each link equally, so the smaller finish first "
       "(TensorFlow issues every variable's receive at once, gRPC interleaves concurrent calls; SimPy engine only; "
       "docs/scenarios.md); replicated (hardsync only; SimPy engine only): TensorFlow's distributed_replicated, "
       "the learners keep local copies: the gradient is pushed piece by piece in backward order as backward "
       "produces it (the layerwise pieces, each ready when backward has done its layers), each piece pulled "
       "back to every learner once every learner's push of it has been applied (a barrier per piece), its "
       "transfers sharing each link, and the next forward starts when the last piece has arrived.",
       choices=("whole", "layerwise", "layerwise-random", "layerwise-shared", "replicated")),
    _s("cluster.server.placement", "dedicated", "colocated: the parameter-server shards run on the worker machines "
       "and share their NICs (docs/scenarios.md).", choices=("dedicated", "colocated")),
    _f("cluster.input.samples_per_s", None, "Input pipeline of a node (decode and augmentation shared by its GPUs): "
       "at most this many samples per second per node; default: no cap (synthetic data).", "samples/s",
       minimum=0, min_exclusive=True, allow_inf=True, optional=True),
    # protocol
    _s("protocol.name", "softsync", "Synchronization protocol.", choices=PROTOCOLS),
    _i("protocol.n", 1, "softsync / bounded_softsync n: an update every ⌊λ/n⌋ gradients (1 ≤ n ≤ λ).",
       minimum=1, maximum=100_000),
    _i("protocol.staleness_bound", 3, "ssp / bounded_softsync bound s on clock difference.", "clocks", minimum=0,
       maximum=10**9),
    _s("protocol.topology", "npdde", "Gossip graph (sgp, dpsgd).", choices=TOPOLOGIES),
    _i("protocol.peers", 1, "Out-peers per iteration (sgp).", minimum=1, maximum=4096),
    _i("protocol.overlap", 0, "sgp τ: iterations a node may run ahead of undelivered messages; dpsgd: 0 "
       "exchanges after the step (blocking, as the SGP reference code), 1 while computing (Lian et al.); "
       "diloco with fragments: inner steps a fragment's averaging overlaps (streaming DiLoCo's τ, "
       "at most H/F − 1).",
       "iterations", minimum=0, maximum=10**6),
    _i("protocol.bucket_bytes", 25 * 2**20, "Gradient bucket: buckets are sent as backward produces them, "
       "overlapping communication with compute (PyTorch DDP: 25 MiB); 0: one message after backward.", "bytes",
       minimum=0, maximum=10**13),
    _s("protocol.library", None, "Communication library preset (`ddlsim hardware`): nccl, gloo, horovod, tf-grpc, "
       "ps-lite: its bucket size, achievable bandwidth, framework cost and compute jitter (docs/hardware.md); "
       "explicit keys win.", optional=True),
    _s("protocol.allreduce_algorithm", None, "All-reduce algorithm; default ring with one GPU per node, "
       "hierarchical otherwise.", choices=ALGORITHMS, optional=True),
    _i("protocol.local_steps", LATE_DEFAULTS["protocol.local_steps"], "local_sgd / diloco H: local (inner) steps "
       "of every node between two averagings.", "steps", minimum=1, maximum=10**9),
    _i("protocol.warmup_steps", LATE_DEFAULTS["protocol.warmup_steps"], "local_sgd: steps of plain all-reduce SGD "
       "before the local steps start (PostLocalSGDState's start_localSGD_iter).", "steps", minimum=0,
       maximum=10**9),
    _f("protocol.outer_lr", LATE_DEFAULTS["protocol.outer_lr"], "diloco: the outer optimizer's learning rate "
       "(Douillard et al. 2023: 0.7).", minimum=0, min_exclusive=True, maximum=1e6),
    _f("protocol.outer_momentum", LATE_DEFAULTS["protocol.outer_momentum"], "diloco: the outer optimizer's "
       "Nesterov momentum (Douillard et al. 2023: 0.9; 0 is plain outer SGD).", minimum=0, maximum=1,
       max_exclusive=True),
    _i("protocol.fragments", LATE_DEFAULTS["protocol.fragments"], "diloco F: the model's tensors split into F "
       "fragments synchronised in turn, one every H/F inner steps (streaming DiLoCo); 1: the whole model every H.",
       minimum=1, maximum=10**6),
    _s("protocol.compression", LATE_DEFAULTS["protocol.compression"], "What allreduce, local_sgd and diloco "
       "send when they average: float32 (none), fp16 / bf16 (DDP's compress hooks), or PowerSGD's rank-r factors "
       "with error feedback.", choices=COMPRESSIONS),
    _i("protocol.powersgd_rank", LATE_DEFAULTS["protocol.powersgd_rank"], "PowerSGD's rank r (a matrix of a "
       "smaller side ≤ r is sent exactly).", minimum=1, maximum=10**6),
    _i("protocol.powersgd_warmup", LATE_DEFAULTS["protocol.powersgd_warmup"], "PowerSGD: averagings sent "
       "uncompressed first (the DDP hook's start_powerSGD_iter).", "steps", minimum=0, maximum=10**9),
    # live backend
    _s("live.compute", "real", "Live learners compute real gradients, or sleep for the compute "
       "model's time (emulated).", choices=("real", "emulated")),
    _s("live.host", "127.0.0.1", "Address the live processes bind and connect to.", check=_check_host),
    _i("live.port", 0, "TCP port of the live rendezvous; 0 picks a free one.", minimum=0, maximum=65535),
    _f("live.timeout_s", 60.0, "Limit of every blocking live call; a dead learner ends the run.", "s",
       minimum=0, min_exclusive=True, maximum=1e6),
    _i("live.fail_learner", -1, "Fault injection: this learner fails (−1: none).", minimum=-1,
       maximum=100_000),
    _i("live.fail_after", 1, "Fault injection: after this many gradients.", minimum=0, maximum=10**9),
    _s("live.fail_mode", "kill", "Fault injection: how the learner fails: it kills itself, or it hangs "
       "(keeps running, never answers again).", choices=("kill", "hang")),
)

FIELD_BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS}
SECTIONS: frozenset[str] = frozenset(
    ".".join(f.key.split(".")[:i]) for f in FIELDS for i in range(1, f.key.count(".") + 1)
)


def defaults() -> dict[str, Any]:
    """A nested dict holding every key at its default value."""
    out: dict[str, Any] = {}
    for f in FIELDS:
        set_dotted(out, f.key, list(f.default) if isinstance(f.default, list) else f.default)
    return out


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``tree[a][b][c] = value`` for ``key = "a.b.c"``, creating tables."""
    *parents, leaf = key.split(".")
    node = tree
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def get_dotted(tree: dict[str, Any], key: str) -> Any:
    """Return ``tree[a][b][c]`` for ``key = "a.b.c"``."""
    node: Any = tree
    for p in key.split("."):
        node = node[p]
    return node


def type_name(value: Any) -> str:
    """TOML-ish name of a value's type, for messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__


def check_value(f: Field, value: Any) -> tuple[Any, str | None]:
    """Coerce ``value`` to the field's type; return (value, problem or None).

    The one range check of every scenario number: the type, then ``minimum``/``maximum``
    compared exactly (an integer of any size is compared, never converted to a float first),
    so a value too large for the simulator is refused here with the key's range."""
    if value is None and f.optional:
        return None, None
    if f.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                value = int(value)
            else:
                return value, f"expected an integer, got {type_name(value)}"
    elif f.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value, f"expected a number, got {type_name(value)}"
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float
            return value, f"too large: must be {f.range_text()}"
        value = number
        if math.isnan(value):
            return value, "NaN is not allowed"
        if math.isinf(value) and not (f.allow_inf and value > 0):
            return value, "must be finite"
    elif f.kind == "str":
        if not isinstance(value, str):
            return value, f"expected a string, got {type_name(value)}"
        if f.choices and value not in f.choices:
            return value, f"must be one of {', '.join(f.choices)}{did_you_mean(value, f.choices)}"
    elif f.kind == "list":
        if not isinstance(value, list):
            return value, f"expected an array, got {type_name(value)}"
    if f.kind in ("int", "float") and not (f.allow_inf and value == math.inf):
        if f.minimum is not None and (value < f.minimum or (f.min_exclusive and value == f.minimum)):
            return value, f"must be {f.range_text()}"
        if f.maximum is not None and (value > f.maximum or (f.max_exclusive and value == f.maximum)):
            return value, f"must be {f.range_text()}"
    if f.check is not None:
        problem = f.check(value)
        if problem:
            return value, problem
    return value, None
