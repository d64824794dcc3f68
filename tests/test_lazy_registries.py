"""The policy and cost-model registries import a module only when one of its entries is used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvsched.costmodel import REGISTRY, UnitCost, make_cost_model
from kvsched.errors import InputError
from kvsched.heuristics import POLICIES, list_policies, make_policy


def _modules_after(code: str) -> list[str]:
    listing = "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kvsched.'))))"
    probe = f"import json, sys\n{code}\n{listing}"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_make_policy_imports_only_its_policy_module():
    loaded = _modules_after("from kvsched.heuristics import make_policy; make_policy('sarathi')")
    assert "kvsched.heuristics.infermax" in loaded
    for other in ("mcsf", "wait", "engines", "rad", "slai", "kfcfs", "priority"):
        assert f"kvsched.heuristics.{other}" not in loaded, other


def test_make_cost_model_imports_only_its_model_module():
    loaded = _modules_after("from kvsched.costmodel import make_cost_model; make_cost_model('unit')")
    assert "kvsched.costmodel.unit" in loaded
    for other in ("calibrated", "infermax", "piecewise", "rad", "roofline"):
        assert f"kvsched.costmodel.{other}" not in loaded, other


def test_the_policy_registry_lists_every_group_in_order():
    names = list(POLICIES)
    assert len(names) == len(set(names)) == len(POLICIES) == len(list_policies())
    assert names[:2] == ["vllm", "vllm-ef"] and names[-1] == "class-priority"
    assert "wait" in POLICIES and "nope" not in POLICIES and POLICIES.get("nope") is None
    assert make_policy("class-priority", inner="wait").name == "class-priority"
    with pytest.raises(InputError, match="unknown policy 'nope'"):
        make_policy("nope")


def test_the_cost_model_registry_reads_as_before():
    assert list(REGISTRY) == [
        "unit",
        "infermax-linear",
        "hinge",
        "staircase",
        "rad",
        "roofline",
        "calibrated",
    ]
    assert REGISTRY["unit"] is UnitCost and isinstance(make_cost_model("unit"), UnitCost)
    with pytest.raises(InputError, match="unknown cost model 'nope'"):
        make_cost_model("nope")
    with pytest.raises(AttributeError):
        import kvsched.costmodel as cm

        cm.NoSuchModel  # noqa: B018
