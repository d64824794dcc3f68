"""A scheduler of one's own: its decisions' form is checked, each mistake one KvschedError naming it."""

import json
from types import MappingProxyType

import numpy as np
import pytest

import kvsched as kv
from kvsched.cli import main
from kvsched.errors import InputError, KvschedError
from kvsched.heuristics.own import CheckedPolicy, is_file_ref, is_own, load_policy_file
from kvsched.instances.io import load_instance
from tests.test_examples import EXAMPLES

FIG15 = load_instance(EXAMPLES / "figure15.json")


class Serial:
    """One request at a time, whole prompt then its decodes (legal, and the decisions' form is the test's)."""

    name = "serial"
    uses_true_output = False
    params = MappingProxyType({})

    def __init__(self, shape=None):
        self.shape = shape or (lambda r, c: kv.Decision([r], [c]))

    def reset(self, instance):
        pass

    def next_batch(self, view):
        active = view.active()
        if not active.size:
            return None
        r = int(active[0])
        return self.shape(r, int(view.unprocessed(r)))


def test_a_well_formed_own_policy_runs_and_matches_its_serial_value():
    for shape in (
        lambda r, c: kv.Decision([r], [c]),
        lambda r, c: kv.Decision(np.array([r]), np.array([c], dtype=np.int32)),
        lambda r, c: kv.Decision((np.int64(r),), (c,), ()),
    ):
        sim = kv.simulate(FIG15, Serial(shape))
        assert kv.validate(FIG15, sim.schedule).ok
        assert kv.OBJECTIVES["total-latency"](sim.trace) == 40
        assert sim.schedule.meta["policy"] == "serial"


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (lambda r, c: [r], r"policy 'serial' returned list at t=0: next_batch returns a kvsched Decision"),
        (lambda r, c: kv.Decision([f"r{r}"], [c]), r"Decision.requests must hold integers, got 'r0'"),
        (lambda r, c: kv.Decision([r], [c + 0.5]), r"Decision.tokens must hold integers, got 4.5"),
        (lambda r, c: kv.Decision([r], [float("nan")]), r"Decision.tokens must hold integers, got nan"),
        (lambda r, c: kv.Decision([r], [True]), r"Decision.tokens must hold integers, got True"),
        (lambda r, c: kv.Decision([r], None), r"Decision.tokens must be a flat list of integers, got None"),
        (lambda r, c: kv.Decision([[r]], [[c]]), r"Decision.requests must be a flat list .* shape \(1, 1\)"),
        (lambda r, c: kv.Decision([r, r + 1], [c]), r"one token count per request, got 2 requests and 1"),
        (lambda r, c: kv.Decision([99], [c]), r"Decision.requests holds 99, not a request position \(0 to 3"),
        (lambda r, c: kv.Decision([-1], [c]), r"Decision.requests holds -1, not a request position"),
        (lambda r, c: kv.Decision([r], [c], [7]), r"Decision.evict holds 7, not a request position"),
        (lambda r, c: kv.Decision([r], [0]), r"\[bad-tokens\] 0 tokens"),  # a rule: the core's own words
    ],
)
def test_a_malformed_decision_is_one_error_naming_the_policy_and_field(shape, message):
    with pytest.raises(KvschedError, match=message):
        kv.simulate(FIG15, Serial(shape))


def test_registered_policies_are_not_wrapped_and_own_subclasses_are():
    assert not is_own(kv.make_policy("vllm"))
    sub = type("MyVllm", (type(kv.make_policy("vllm")),), {})()
    assert is_own(sub) and is_own(Serial())
    checked = CheckedPolicy(sub)
    # The opt-in run contracts are the policy's own, found through the wrapper.
    assert checked.repeat_decodes == sub.repeat_decodes
    mine, theirs = kv.simulate(FIG15, sub).trace, kv.simulate(FIG15, kv.make_policy("vllm")).trace
    assert mine.num_batches == theirs.num_batches and mine.state.evictions.sum() == 2


# ----------------------------------------------------------------------------- FILE.py:CLASS
POLICY_FILE = """
import kvsched as kv


class Serial:
    name = "serial-from-file"
    uses_true_output = False
    params = {}

    def __init__(self, first=0, crash_at=None):
        self.first = first
        self.crash_at = crash_at  # the batch whose decision raises (a bug of one's own)

    def reset(self, instance):
        self.batches = 0

    def next_batch(self, view):
        self.batches += 1
        if self.batches == self.crash_at:
            raise ZeroDivisionError("my bug")
        active = view.active()
        if not active.size:
            return None
        r = int(active[0])
        return kv.Decision([r], [int(view.unprocessed(r))])
"""


def test_a_policy_class_in_a_file_runs_with_its_parameters(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(POLICY_FILE)
    policy = load_policy_file(f"{path}:Serial", {"first": 3})
    assert policy.first == 3 and is_file_ref(f"{path}:Serial") and not is_file_ref("vllm")
    assert kv.OBJECTIVES["total-latency"](kv.simulate(FIG15, policy).trace) == 40


@pytest.mark.parametrize(
    ("ref", "params", "message"),
    [
        ("{dir}/nothere.py:Serial", None, r"nothere.py is not a file"),
        ("{dir}/mine.py:Nope", None, r"mine.py has no 'Nope' \(classes with next_batch there: Serial\)"),
        ("{dir}/broken.py:Serial", None, r"importing .*broken.py raised RuntimeError: boom"),
        ("{dir}/mine.py:Serial", {"second": 1}, r"Serial\(\.\.\.\) raised TypeError: .*second"),
        ("{dir}/mine.py:kv", None, r"kv\(\.\.\.\) raised TypeError|is not a policy"),
        ("{dir}/mine.txt:Serial", None, r"expected FILE.py:CLASS"),
    ],
)
def test_a_policy_file_that_cannot_give_a_policy_is_one_input_error(tmp_path, ref, params, message):
    (tmp_path / "mine.py").write_text(POLICY_FILE)
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(InputError, match=message):
        load_policy_file(ref.format(dir=tmp_path), params)


def test_simulate_and_compare_take_a_policy_file_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text(POLICY_FILE)
    fig15 = str(EXAMPLES / "figure15.json")
    assert main(["simulate", fig15, "-p", f"{path}:Serial", "--param", "first=1"]) == 0
    js = tmp_path / "cmp.json"
    assert (
        main(["compare", fig15, "--policies", f"vllm,{path}:Serial", "--no-solver", "--json", str(js)]) == 0
    )
    rows = {r["name"]: r["objective"] for r in json.loads(js.read_text())["rows"]}
    assert rows == {"vllm": 36, "serial-from-file": 40}
    capsys.readouterr()
    assert main(["compare", fig15, "--policies", f"{path}:Serial", "--no-solver", "--csv", str(path)]) != 0
    assert "--csv" in capsys.readouterr().err and path.read_text() == POLICY_FILE
