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
from collections.abc import Callable

from .schema import ScenarioError


class DaskExecutor(Executor):
    """``submit``/``shutdown`` over a ``distributed.Client`` (and its LocalCluster, if ours)."""

    def __init__(self, client: Any, cluster: Any = None) -> None:
        self.client, self.cluster = client, cluster
        self._inner = client.get_executor(pure=False)

    def submit(self, fn, /, *args, **kwargs):
        return self._inner.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._inner.shutdown(wait=wait)
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()


CONNECT_TIMEOUT_S = 10.0  # the whole connection to a Dask scheduler: connect, handshake, registration


def check_scheduler(address: str | None) -> None:
    """Refuse, before any work, a ``--scheduler`` value that is not a Dask scheduler address
    (empty, an unknown scheme, no host or port, a port outside 1–65535; ``inproc://`` only
    names a scheduler of this process). ``None`` (no option) passes."""
    if address is None:
        return
    if not address.strip():
        raise ScenarioError(f"--scheduler {address!r}: not an address (expected e.g. tcp://HOST:8786)")
    try:
        from distributed.comm.addressing import parse_address, parse_host_port
        from distributed.comm.registry import get_backend
    except ImportError:
        raise ScenarioError("--executor dask needs Dask: python3 -m pip install -e '.[dask]'") from None
    try:
        scheme, loc = parse_address(address)
        get_backend(scheme)
        if scheme == "inproc":
            raise ValueError("inproc:// names a scheduler inside this process; use tcp://HOST:PORT")
        if scheme in ("tcp", "tls", "ws", "wss"):
            host, port = parse_host_port(loc)
            if not host or not 1 <= int(port) <= 65535:
                raise ValueError("expected HOST:PORT with a port between 1 and 65535")
    except (ValueError, TypeError, NotImplementedError) as e:
        raise ScenarioError(f"--scheduler {address}: not a Dask scheduler address ({e or 'unsupported'})") from None


def probe_scheduler(address: str, timeout_s: float) -> None:
    """Ask ``address`` who it is (Dask's ``identity`` request), the whole exchange within
    ``timeout_s``; return if a Dask scheduler answered, else one ScenarioError line.

    ``distributed``'s own connect bounds the TCP connect but not the handshake read that
    follows it, nor a frame length the peer claims: a listener that accepts and says nothing
    would hang the client, one that claims a 4 EiB frame would make it allocate that.
    """
    import asyncio

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=timeout_s)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded() -> Any:
        return await asyncio.wait_for(ask(), timeout_s)

    try:
        reply = _in_thread(lambda: asyncio.run(bounded()), timeout_s + 1.0)
    except TimeoutError:
        raise ScenarioError(f"--scheduler {address}: no Dask scheduler answered at {address} "
                            f"within {timeout_s:g} s") from None
    except MemoryError:
        raise ScenarioError(f"--scheduler {address}: what answered announced a message larger than this "
                            "machine's memory: not a Dask scheduler") from None
    except Exception as e:  # refused, reset, garbage: the peer's fault, one line
        raise ScenarioError(f"--scheduler {address}: cannot connect to the Dask scheduler "
                            f"({_first_line(e)})") from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        kind = reply.get("type") if isinstance(reply, dict) else type(reply).__name__
        raise ScenarioError(f"--scheduler {address}: what answered is not a Dask scheduler (it says {kind!r})")


def _in_thread(fn: Callable[[], Any], limit_s: float) -> Any:
    """``fn()`` in a daemon thread of its own (its own event loop, whatever this thread
    runs); its result or exception, or TimeoutError when it takes longer than ``limit_s``."""
    import threading

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    worker = threading.Thread(target=target, name="ddlsim-dask-connect", daemon=True)
    worker.start()
    worker.join(limit_s)
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        raise TimeoutError(f"no answer within {limit_s:g} s")
    return box["value"]


def _first_line(err: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def connect_client(address: str, timeout_s: float | None = None) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address``, or one ScenarioError line.

    The address is checked (:func:`check_scheduler`), the peer must answer as a Dask
    scheduler (:func:`probe_scheduler`), and the client's own connection and registration
    are bounded too: nothing here waits much longer than ``timeout_s`` (default
    :data:`CONNECT_TIMEOUT_S`).
    """
    from distributed import Client

    check_scheduler(address)
    limit = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    probe_scheduler(address, limit)
    try:  # the client's registration has no bound of its own
        return _in_thread(lambda: Client(address, timeout=f"{limit}s", set_as_default=False), limit + 1.0)
    except TimeoutError:
        raise ScenarioError(f"--scheduler {address}: no Dask scheduler answered at {address} "
                            f"within {limit:g} s") from None
    except Exception as e:
        raise ScenarioError(f"--scheduler {address}: cannot connect to the Dask scheduler "
                            f"({_first_line(e)})") from None


def check_executor(kind: str, scheduler: str | None, timeout_s: float | None = None) -> None:
    """Before any work: ``--scheduler`` only with ``--executor dask``, a valid address
    (:func:`check_scheduler`) and a Dask scheduler answering there (:func:`probe_scheduler`),
    so that a wrong address writes nothing."""
    if scheduler is None:
        return
    if kind != "dask":
        raise ScenarioError(f"--scheduler {scheduler or repr(scheduler)}: only with --executor dask")
    check_scheduler(scheduler)
    probe_scheduler(scheduler, CONNECT_TIMEOUT_S if timeout_s is None else timeout_s)


def dask_executor(scheduler: str | None, workers: int | None = None) -> DaskExecutor:
    """Connect to ``scheduler`` (bounded: :func:`connect_client`), or, when it is None, start
    a local cluster of ``workers`` processes."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ScenarioError("--executor dask needs Dask: python3 -m pip install -e '.[dask]'") from None
    if scheduler is not None:
        return DaskExecutor(connect_client(scheduler))
    cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=1, processes=True,
                           dashboard_address=None, env={"OMP_NUM_THREADS": "1"})
    return DaskExecutor(Client(cluster), cluster)


def make_executor(kind: str, jobs: int, scheduler: str | None = None) -> Executor:
    """A ``concurrent.futures`` executor: local processes, or a Dask cluster's client."""
    if kind == "dask":
        return dask_executor(scheduler, jobs)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(os.getpid(),))


def _worker_init(parent: int | None = None) -> None:
    """A local worker process (before it imports torch): one OpenMP thread, as each point's
    backend uses one torch thread (several small models in parallel processes beat one
    process with many threads). Set in the worker only; the parent's environment is not
    touched. With ``parent`` (the launching process's pid) the worker dies with it
    (:func:`die_with_parent`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if parent is not None:
        die_with_parent(parent)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCHDOG_PERIOD_S = 0.5


def die_with_parent(parent: int) -> None:
    """Make this process exit when process ``parent`` dies, even by SIGKILL: on Linux the
    kernel sends it SIGKILL then (``prctl(PR_SET_PDEATHSIG)``; the pool's processes are
    started by the thread that submits, which outlives the pool); everywhere a daemon thread
    checks every :data:`WATCHDOG_PERIOD_S` s that ``parent`` is still this process's parent
    (when it dies the process is re-parented) and ends the process if not. A parent already
    gone when this runs ends it at once."""
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the watchdog alone
            pass
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_PERIOD_S)
        os._exit(1)

    threading.Thread(target=watch, name="ddlsim-parent-watchdog", daemon=True).start()


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
