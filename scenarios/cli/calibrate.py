"""``ddlsim calibrate``: measure compute, server and network costs here, or fit a network
profile to an nccl-tests log; write a profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ...backends import calibrate_network as cn
from ...backends.device import resolve_device
from ...simulator.catalog import EMBEDDED_DATASETS, FILE_DATASETS, TRAINABLE_MODELS
from ...simulator.compute import PROFILE_HEAD
from ...simulator.files import check_target, read_bounded
from ..load import load_text
from ..schema import ScenarioError


# the compute profile's options, and their defaults (None on the parser, so that a network
# profile's command can tell one was given)
COMPUTE_DEFAULTS = {"model": "mlp", "dataset": "digits", "minibatches": "1,2,4,8,16,32,64,128"}


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.out is not None and not args.out.strip():
        raise ScenarioError("--out '': an empty path names no file (leave --out out for the default under profiles/)")
    if args.nccl_tests is not None or args.network:
        given = [k for k in COMPUTE_DEFAULTS if getattr(args, k) is not None]
        given += [k for k in ("no_network", "no_cycle") if getattr(args, k)]
        if given:
            option = "--" + given[0].replace("_", "-")
            raise ScenarioError(f"{option}: only for a compute profile (a network profile, --nccl-tests or "
                                "--network, does not use it)")
        return cmd_calibrate_network(args)
    for key, default in COMPUTE_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    for option, value in (("--ranks", args.ranks), ("--collective", args.collective), ("--scope", args.scope),
                          ("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes)):
        if value is not None:
            raise ScenarioError(f"{option}: only with --nccl-tests LOG or --network (a network profile)")
    from ...backends.calibrate import calibrate, cycle_scenario

    try:
        sizes = [int(v) for v in args.minibatches.split(",")]
    except ValueError:
        raise ScenarioError(f"--minibatches {args.minibatches!r}: expected comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise ScenarioError(f"--minibatches {args.minibatches!r}: sizes must be ≥ 1")
    if max(sizes) > 1_000_000:
        raise ScenarioError(f"--minibatches {args.minibatches!r}: sizes must be ≤ 1000000")
    if len(set(sizes)) < len(sizes):
        twice = next(v for v in sizes if sizes.count(v) > 1)
        raise ScenarioError(f"--minibatches {args.minibatches!r}: size {twice} is given twice; each size once")
    resolve_device(args.device)
    out = Path(args.out or f"profiles/{args.model}-{args.dataset}-{args.device}.toml")
    check_target(out)  # a link (dangling or not), a directory, a device: refused before anything
    existed = out.exists()
    if existed and not args.force and not read_bounded(out, 1 << 20, "profile").startswith(PROFILE_HEAD.encode()):
        raise ScenarioError(f"--out {out}: exists and is not a profile ddlsim wrote; name another file, or --force")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a"):  # writable? (fails now, not after the measurements)
        pass
    def cycle_point(apply_s: float, bandwidth_Bps: float) -> dict:
        return load_text(cycle_scenario(args.model, args.dataset, apply_s, bandwidth_Bps)).points()[0]

    try:
        m = calibrate(args.model, args.dataset, args.device, sizes, out, network=not args.no_network,
                      cycle=None if args.no_cycle else cycle_point)
    except BaseException:
        if not existed:  # no empty profile left behind for validate to read as "no calibration"
            out.unlink(missing_ok=True)
        raise
    for mu, s in zip(m["minibatch"], m["seconds"]):
        print(f"μ = {mu:5d}: {s * 1e3:9.3f} ms per minibatch")
    print(f"server apply: {m['apply_s'] * 1e6:.1f} µs per gradient")
    if not args.no_network:
        print(f"loopback ping-pong: latency {m['pingpong_latency_s'] * 1e6:.1f} µs, "
              f"bandwidth {m['bandwidth_Bps'] / 1e9:.2f} GB/s")
        if not args.no_cycle:
            print(f"live push-pull cycle: round trip {m['cycle_round_trip_s'] * 1e6:.1f} µs → "
                  f"latency_s {m['latency_s'] * 1e6:.1f} µs per message (written to the profile)")
    print(f"profile: {out}")
    return 0


def cmd_calibrate_network(args: argparse.Namespace) -> int:
    """``calibrate --nccl-tests LOG`` or ``calibrate --network``: a network profile."""
    if args.nccl_tests is not None and args.network:
        raise ScenarioError("--nccl-tests and --network: give one (a log to fit, or a measurement here)")
    if args.nccl_tests is not None:
        _, cal = cn.from_nccl_tests(args.nccl_tests, Path(args.out) if args.out else None, args.force, args.ranks,
                                    args.collective, args.scope, args.min_bytes, args.max_bytes)
    else:
        if args.collective not in (None, "all_reduce"):
            raise ScenarioError(f"--collective {args.collective}: --network measures all_reduce")
        if args.min_bytes is not None:
            raise ScenarioError("--min-bytes: only with --nccl-tests (the sweep starts at 8 B)")
        cal = cn.measured(Path(args.out) if args.out else None, args.force, args.ranks, args.device, args.max_bytes,
                          args.scope)
    for line in cn.report_lines(cal):
        print(line)
    return 0


def register(sub: Any) -> None:
    """Add ``calibrate`` to the ``ddlsim`` parser."""
    p = sub.add_parser("calibrate", help="measure compute, server and loopback network costs; write a profile")
    p.add_argument("--model", choices=TRAINABLE_MODELS, help="model to time (default mlp)")
    p.add_argument("--dataset", choices=EMBEDDED_DATASETS + FILE_DATASETS,
                   help="data set whose input shape the model takes (default digits)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--minibatches", help="comma-separated minibatch sizes (default 1,2,4,8,16,32,64,128)")
    p.add_argument("--no-network", action="store_true", help="skip the loopback network measurements")
    p.add_argument("--no-cycle", action="store_true",
                   help="latency from the raw ping-pong instead of a short live push-pull run")
    p.add_argument("--out", help="profile file (default profiles/MODEL-DATASET-DEVICE.toml; network profiles: "
                                 "profiles/network-….toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file that is not a ddlsim profile")
    p.add_argument("--nccl-tests", metavar="LOG", help="fit α and β to an all_reduce_perf / all_gather_perf log; "
                                                       "write a network profile (cluster.network.profile)")
    p.add_argument("--network", action="store_true",
                   help="measure α and β with torch.distributed all-reduces here; write a network profile")
    p.add_argument("--ranks", type=int, help="--nccl-tests: ranks of a log without '#  Rank' lines; "
                                             "--network: processes (default 2)")
    p.add_argument("--collective", choices=("all_reduce", "all_gather"),
                   help="--nccl-tests: the log's collective (default: from its busbw/algbw)")
    p.add_argument("--scope", choices=("inter", "intra"),
                   help="link the profile sets: between nodes or inside one (default: inter for several hosts "
                        "or gloo, intra for one host's GPUs)")
    p.add_argument("--min-bytes", type=int, help="--nccl-tests: fit only the rows of at least this many bytes "
                                                 "(e.g. the gradient bucket's size)")
    p.add_argument("--max-bytes", type=int, help="--nccl-tests: fit only the rows of at most this many bytes; "
                                                 "--network: the largest all-reduce (default 16 MiB)")
    p.set_defaults(func=cmd_calibrate)
