"""FIFO resources computed by reservation instead of per-request processes.

A single-server FIFO queue whose requests arrive in non-decreasing time order needs no
process per request: request ``k`` arriving at ``a_k`` with service ``s_k`` starts at
``max(a_k, end_{k-1})`` and ends ``s_k`` later (Lindley's recursion). Every shared
resource of the cluster model (a NIC direction, a server shard, an aggregator) is a
:class:`FifoServer`; callers reserve in simulated-time order, which the event loop
guarantees. ``tests/test_resources.py`` checks the equivalence with ``simpy.Resource``.
"""

from __future__ import annotations


class FifoServer:
    """A FIFO single server: ``reserve(arrival, service) -> end``.

    Keeps the Lindley recursion and the busy time, waiting time and count needed for
    utilisation and mean-wait figures. Arrivals must not decrease.
    """

    __slots__ = ("name", "free_at", "busy_s", "wait_s", "served", "_last_arrival")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.free_at = 0.0
        self.busy_s = 0.0
        self.wait_s = 0.0
        self.served = 0
        self._last_arrival = 0.0

    def reserve(self, arrival: float, service: float) -> float:
        """Queue a request arriving at ``arrival`` needing ``service`` seconds; return its end."""
        if arrival < self._last_arrival - 1e-9:
            raise ValueError(f"{self.name}: arrival {arrival} before previous {self._last_arrival}")
        self._last_arrival = arrival
        free = self.free_at
        if free > arrival:
            self.wait_s += free - arrival
            arrival = free
        end = self.free_at = arrival + service
        self.busy_s += service
        self.served += 1
        return end

    def utilization(self, horizon_s: float) -> float:
        """Fraction of ``[0, horizon_s]`` spent serving."""
        return min(1.0, self.busy_s / horizon_s) if horizon_s > 0 else 0.0

    def mean_wait(self) -> float:
        """Mean time a request waited before its service started."""
        return self.wait_s / self.served if self.served else 0.0
