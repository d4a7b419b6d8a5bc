"""Where sweep points run: local worker processes, or a Dask cluster (``concurrent.futures``).

* ``local``: a ``ProcessPoolExecutor`` of spawned processes, one OpenMP/torch thread each
  (set in the worker only);
* ``dask``: ``--scheduler ADDRESS`` connects to a running scheduler; without an address a
  ``LocalCluster`` of one-thread worker processes is started. With a real cluster, ``--out``
  must be on a file system the workers share (they write the traces).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Executor, ProcessPoolExecutor
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


def make_executor(kind: str, jobs: int, scheduler: str | None = None) -> Executor:
    """A ``concurrent.futures`` executor: local processes, or a Dask cluster's client."""
    if kind == "dask":
        return dask_executor(scheduler, jobs)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init)


def _worker_init() -> None:
    """A local worker process (before it imports torch): one OpenMP thread, as each point's
    backend uses one torch thread (several small models in parallel processes beat one
    process with many threads). Set in the worker only; the parent's environment is not
    touched."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def stop_executor(ex: Executor) -> None:
    """Cancel pending points and end the worker processes now, without waiting for them.

    ``ProcessPoolExecutor.terminate_workers`` (Python ≥ 3.14) does this; before it, the
    executor's ``_processes`` (a private dict of its worker processes, present in CPython
    3.8–3.13) is the only handle: without it a running point would finish before the
    executor shuts down (minutes for a long replay after Ctrl-C). A Python without either
    just shuts down without waiting.
    """
    terminate = getattr(ex, "terminate_workers", None)
    if callable(terminate):
        terminate()
        return
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    ex.shutdown(wait=False, cancel_futures=True)
