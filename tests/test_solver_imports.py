"""ortools 9.15 bundles HiGHS 1.12: highspy must be the same HiGHS or one import fails.

Each import order runs in a fresh interpreter, because the clash only shows for
whichever module loads libhighs second.
"""

import subprocess
import sys

import pytest

ORDERS = {
    "ortools-first": "from ortools.sat.python import cp_model\nfrom ortools.linear_solver import pywraplp\nimport highspy",
    "highspy-first": "import highspy\nfrom ortools.sat.python import cp_model\nfrom ortools.linear_solver import pywraplp",
}

USE_BOTH = """
h = highspy.Highs()
h.setOptionValue("output_flag", False)
h.setOptionValue("threads", 1)
inf = highspy.kHighsInf
h.addVar(0, inf); h.addVar(0, inf)
h.changeColCost(0, 1.0); h.changeColCost(1, 1.0)
h.addRow(2.0, inf, 2, [0, 1], [1.0, 1.0])
h.run()
assert abs(h.getInfo().objective_function_value - 2.0) < 1e-9
m = cp_model.CpModel(); x = m.new_int_var(0, 5, "x"); m.add(x >= 3); m.minimize(x)
s = cp_model.CpSolver(); s.parameters.num_workers = 1
assert s.solve(m) == cp_model.OPTIMAL and s.value(x) == 3
print(highspy.Highs().version())
"""


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_ortools_and_highspy_load_in_one_process(order):
    proc = subprocess.run(
        [sys.executable, "-c", ORDERS[order] + USE_BOTH], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("1.12")


def test_pulp_has_a_cbc_solver():
    import pulp

    assert pulp.PULP_CBC_CMD(msg=False, threads=1).available()
