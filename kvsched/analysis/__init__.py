"""Studies over schedules: comparisons, sweeps, regret tables, plots and reports.

* :mod:`~kvsched.analysis.compare`: every policy and the exact solver on one instance, with regret;
* :mod:`~kvsched.analysis.spec`, :mod:`~kvsched.analysis.sweep`, :mod:`~kvsched.analysis.store`:
  YAML sweep specs, their parallel runs and the SQLite results database;
* :mod:`~kvsched.analysis.regret`: regret per policy over a sweep;
* :mod:`~kvsched.analysis.plots`, :mod:`~kvsched.analysis.report`: figures and self-contained HTML reports.
"""

from kvsched.analysis.compare import Comparison, add_regret, compare, global_lower_bound

__all__ = ["Comparison", "add_regret", "compare", "global_lower_bound"]
