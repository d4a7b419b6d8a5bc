"""Seed tags: every random stream of a run is ``SeedSequence([seed, TAG, ...])`` with one tag here.

Streams with different tags are independent; the same tag in two places (the simulator and
the live backend) gives the same draws, which is what lets a live run reproduce a simulated
one's compute times and stragglers.
"""

from __future__ import annotations

CLOCKS = 1          # learners' compute draws, stalls and the persistent stragglers
SERVER_APPLY = 7    # the parameter server's apply-time draws
ADPSGD_PEERS = 11   # AD-PSGD's random choice of a passive neighbour
DATA_ORDER = 0xD47A  # the per-epoch permutations of the training set
