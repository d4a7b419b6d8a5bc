"""A Dask distributed cluster as a ``concurrent.futures`` executor.

``--executor dask --scheduler ADDRESS`` connects to a running scheduler; without an
address a ``LocalCluster`` of one-thread worker processes is started. With a real
cluster, ``--out`` must be on a file system the workers share (they write the traces).
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any

from .schema import ScenarioError


class DaskExecutor(Executor):
    """``submit``/``shutdown`` over a ``distributed.Client`` (and its LocalCluster, if ours)."""

    def __init__(self, client: Any, cluster: Any = None) -> None:
        self.client, self.cluster = client, cluster
        self._inner = client.get_executor(pure=False)

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        return self._inner.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._inner.shutdown(wait=wait)
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def dask_executor(scheduler: str | None, workers: int | None = None) -> DaskExecutor:
    """Connect to ``scheduler``, or start a local cluster of ``workers`` processes."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ScenarioError("--executor dask needs Dask: python3 -m pip install -e '.[dask]'") from None
    if scheduler:
        try:
            return DaskExecutor(Client(scheduler, timeout="10s"))
        except OSError as e:
            raise ScenarioError(f"--scheduler {scheduler}: cannot connect to the Dask scheduler ({e})") from None
    cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=1, processes=True,
                           dashboard_address=None, env={"OMP_NUM_THREADS": "1"})
    return DaskExecutor(Client(cluster), cluster)
