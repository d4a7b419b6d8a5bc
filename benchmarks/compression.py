"""PowerSGD's two forms (backends/compression.py) against each other, as paired ratios.

For each model's parameter shapes and node count, the per-tensor form (``batched=False``: one
``torch.bmm`` per tensor and node, the hook's operations) and the node-stacked form
(``batched=True``) average the same random gradients for a few steps, in interleaved rounds
(the order alternates), on one thread; reported: per-tensor time / batched time, median and
quartiles. A ratio above 1 means the batched form is faster.

    python benchmarks/compression.py [--rounds 9] [--rank 2] [--steps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddlsim.backends.compression import PowerSGDState

MODELS = {
    "digits MLP 64-128-10": [(128, 64), (128,), (10, 128), (10,)],
    "MLP 784-512-512-10": [(512, 784), (512,), (512, 512), (512,), (10, 512), (10,)],
}


def ratio(shapes: list[tuple[int, ...]], nodes: int, rank: int, rounds: int, steps: int) -> list[float]:
    """Per-tensor / batched time of ``steps`` PowerSGD averages, one value per round."""
    gen = torch.Generator().manual_seed(0)
    grads = [[[torch.randn(*s, generator=gen) for s in shapes] for _ in range(nodes)] for _ in range(steps)]
    out = []
    for r in range(rounds):
        took: dict[bool, float] = {}
        for batched in ((False, True) if r % 2 == 0 else (True, False)):
            state = PowerSGDState(rank, 0, 0, batched=batched)
            t = time.perf_counter()
            for k in range(steps):
                state.average(grads[k], k)
            took[batched] = time.perf_counter() - t
        out.append(took[False] / took[True])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, shapes in MODELS.items():
        for nodes in (4, 16):
            rs = ratio(shapes, nodes, args.rank, args.rounds, args.steps)
            q = statistics.quantiles(rs, n=4)
            print(f"{name}, {nodes} nodes, rank {args.rank}: per-tensor / batched = {statistics.median(rs):.2f} "
                  f"(quartiles {q[0]:.2f}–{q[2]:.2f})")


if __name__ == "__main__":
    main()
