"""The bundled examples load, and the README's example schedule is the Figure 15 vLLM pattern."""

from importlib import resources
from pathlib import Path

import pytest

from kvsched.costmodel import UnitCost
from kvsched.instances.io import load_instance
from kvsched.schedule.io import load_schedule, schedule_to_dict
from kvsched.schedule.ir import Schedule
from kvsched.schedule.validate import replay
from tests.test_seed_settings import FIG15_PLAN, step_plan

EXAMPLES = Path(str(resources.files("kvsched.instances") / "examples"))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_every_example_file_loads(path):
    if path.name.endswith(".schedule.json"):
        instance = load_instance(EXAMPLES / (path.name.split("-")[0] + ".json"))
        assert replay(instance, load_schedule(path, instance)).ok
    else:
        assert len(load_instance(path)) > 0


def test_figure15_vllm_example_schedule_is_the_hand_built_pattern():
    instance = load_instance(EXAMPLES / "figure15.json")
    built, _ = step_plan(instance, FIG15_PLAN, UnitCost())
    built = Schedule(built.batches, {"source": "seed 003 Figure 15, vLLM pattern (notes A6)"})
    bundled = load_schedule(EXAMPLES / "figure15-vllm.schedule.json", instance)
    assert bundled.same_as(built, tol=0.0)
    assert schedule_to_dict(bundled, instance) == schedule_to_dict(built, instance)
    trace = replay(instance, bundled)
    assert len(bundled) == 14 and int(trace.state.evictions.sum()) == 2
