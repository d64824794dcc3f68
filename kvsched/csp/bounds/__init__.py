"""Lower bounds valid for every legal schedule of an instance: the bounds portfolio.

Each module holds one family of relaxations and documents its argument (the
table is in ``docs/bounds.md``); :func:`portfolio` runs every bound that applies
to an instance and objective under one :class:`~kvsched.stop.Deadline`.

* :mod:`.combinatorial`: isolated service, KV area and token work (unit time);
* :mod:`.mbt`: mean-busy-time bounds (Goemans; Queyranne) on memory, tokens and prefill (unit time);
* :mod:`.separable`: a lower bound on any cost model's batch time, separable over the batch's items;
* :mod:`.seconds`: isolated service, work area and mean busy time in seconds (any supported cost model);
* :mod:`.portfolio`: the one entry point.
"""

from kvsched.csp.bounds.combinatorial import LowerBounds, lower_bounds
from kvsched.csp.bounds.portfolio import SecondsReport, best, portfolio, seconds_report
from kvsched.csp.bounds.seconds import SecondsBounds, seconds_bounds
from kvsched.csp.bounds.separable import Separable, separable_forms

__all__ = [
    "LowerBounds",
    "SecondsBounds",
    "SecondsReport",
    "Separable",
    "best",
    "lower_bounds",
    "portfolio",
    "seconds_bounds",
    "seconds_report",
    "separable_forms",
]
from kvsched.csp.bounds.chain import ChainLagrangian as ChainLagrangian, chain_lagrangian as chain_lagrangian  # noqa: I001
