"""Studies over schedules: regret tables and comparisons."""

from kvsched.analysis.compare import Comparison, compare

__all__ = ["Comparison", "compare"]
