"""Bounds of the fleet simulator's knobs (:mod:`ledger.simulate`), in a module of their own.

Why apart: ``dra-ledger``'s option definitions need them when the CLI starts, and importing the simulator
itself (its dataclasses) costs every command about 15 ms.
"""

from __future__ import annotations

from typing import Final

# Bounds of the knobs. Past them a run is a typo (``--gpus-per-node 99999999`` once ran for minutes before
# writing a line), not a fleet: they are set well beyond the 5,000-node x 8-GPU fleet of DESIGN §10.
MAX_NODES: Final = 100_000
"""Most nodes: twenty times the largest fleet the ledger is sized for."""
MAX_GPUS_PER_NODE: Final = 128
"""Most GPUs a node: a ResourceSlice lists at most 128 devices (``spec.devices``); real nodes have 8 or 16."""
MAX_GPUS_PER_MIG_NODE: Final = 12
"""Most GPUs a node while any node has MIG partitions (``mig_node_fraction`` > 0): a slice whose devices
consume counters lists at most 64, and a MIG node's lists 12 x (1 + 4 partitions) = 60. (Its 12 counter sets
go in two slices of their own: a slice defines at most 8, and never together with devices.)"""
MAX_HOURS: Final = 8_784.0
"""Most simulated hours: a leap year."""
MAX_TEAMS: Final = 1_000
"""Most teams (two namespaces each by default)."""
MAX_JOB_MINUTES: Final = 43_200.0
"""Longest mean hold time: 30 days."""
