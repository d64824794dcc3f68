"""Runs that follow a completion or a finished prompt without a policy decision (ContinueDecodes)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from kvsched.heuristics import list_policies, make_policy, simulate
from kvsched.heuristics.base import continue_decodes
from kvsched.heuristics.infermax import InferMax
from kvsched.heuristics.kfcfs import KFCFS
from kvsched.heuristics.mcsf import MCSF, AlphaProtection
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.core import EngineState, ScheduleError
from kvsched.schedule.ir import Batch, Run
from kvsched.schedule.validate import instance_cost_model, replay
from tests.test_runs import INSTANCES, stepped_or_same_failure
from tests.test_simulator_equivalence import assert_same_state

CONTINUING = [s.name for s in list_policies() if continue_decodes(make_policy(s.name)) is not None]
#: Each opted-in family's bookkeeping, compared after a run with and without coalescing.
ENGINE_BOOKS = ("_waiting", "_running", "_cursor", "_kv.tokens", "_kv.used")  # vllm-v1, orca
#: InferMax's.
BOOKS = (
    "_alloc",
    "_reserved",
    "_running",
    "_waiting",
    "_key",
    "_seq",
    "_counter",
    "_cursor",
    "_hist",
    "_seen",
)


def _books(policy) -> tuple[str, ...]:
    """The bookkeeping attributes of ``policy`` (dotted paths); KFCFS keeps none between calls."""
    if isinstance(policy, InferMax):
        return BOOKS
    if isinstance(policy, KFCFS):
        return ()
    if isinstance(policy, MCSF):
        return ("_round", "_running", "_waiting")
    if isinstance(policy, AlphaProtection):
        return ("_running", "_waiting", "clears", "passes")
    return ENGINE_BOOKS


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _calls(policy):
    """``policy`` counting its ``next_batch`` calls (in ``policy.calls``)."""
    inner = policy.next_batch
    policy.calls = 0

    def counted(view):
        policy.calls += 1
        return inner(view)

    policy.next_batch = counted
    return policy


def test_the_infermax_family_opts_in_and_the_default_is_no():
    assert {"sarathi", "vllm", "sarathi-ef", "vllm-hy", "sarathi-nocp"} <= set(CONTINUING)
    assert not {"rank-i", "infermax-sec6"} & set(CONTINUING)  # merged groups, kv-desc order
    assert {"kfcfs", "kfcfs-sp", "kfcfs-sr", "vllm-v1", "orca"} <= set(CONTINUING)
    assert not {"slai", "rad", "wait", "fastertransformer"} & set(CONTINUING)  # read time or history
    assert continue_decodes(KFCFS(order="shortest-remaining", lengths="predicted")) is not None
    assert {"mcsf-alg1", "mcsf", "alpha-greedy", "alpha-beta"} <= set(CONTINUING)
    assert continue_decodes(make_policy("class-priority")) is None  # a wrapper does not inherit it
    assert continue_decodes(InferMax(priority="none")) is None
    assert continue_decodes(InferMax(decode_order="kv-desc")) is None


def test_a_run_across_a_completion_is_stepping_batch_by_batch():
    """A completes after 5 tokens, B after 20: after the prefills one run takes both to A's completion,
    and the next run continues with B alone, with no decision and no single batch in between."""
    inst = Instance(
        (Request("A", 0, 3, 5), Request("B", 0, 4, 20)), Limits(kv_capacity=100), TimeModel("unit")
    )
    plain = simulate(inst, make_policy("sarathi"), coalesce=False)
    policy = _calls(make_policy("sarathi"))
    fast = simulate(inst, policy)
    assert fast.schedule.same_as(plain.schedule, tol=0.0)
    kinds = [
        (type(e).__name__, e.requests.tolist(), e.repeat if type(e) is Run else 1)
        for e in fast.schedule.entries
    ]
    assert kinds == [("Batch", [0, 1], 1), ("Run", [0, 1], 4), ("Run", [1], 15)]
    assert policy.calls == 1
    assert_same_state(replay(inst, fast.schedule).state, plain.trace.state)


@pytest.mark.parametrize("name", sorted(INSTANCES))
@pytest.mark.parametrize("policy", CONTINUING)
def test_continued_runs_keep_the_batches_and_the_policys_bookkeeping(name, policy):
    inst = INSTANCES[name]
    plain_policy, fast_policy = _calls(make_policy(policy)), _calls(make_policy(policy))
    plain = stepped_or_same_failure(inst, policy, plain_policy)
    if plain is None:
        return
    fast = simulate(inst, fast_policy)
    assert fast.schedule.same_as(plain.schedule, tol=0.0)
    assert_same_state(fast.trace.state, plain.trace.state)
    for attr in _books(fast_policy):
        a, b = _get(fast_policy, attr), _get(plain_policy, attr)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, attr
    assert_same_state(replay(inst, fast.schedule).state, plain.trace.state)
    # Every continued run saved a decision: the policy was asked once per stored batch, no more.
    batches = sum(type(e) is Batch for e in fast.schedule.entries)
    assert fast_policy.calls >= batches
    assert fast_policy.calls < plain_policy.calls


def test_runs_follow_completions_directly():
    entries = simulate(INSTANCES["poisson-calibrated"], make_policy("sarathi")).schedule.entries
    # A decode run, then one of fewer decodes right after it: a completion left the first.
    followed = sum(
        type(a) is Run
        and type(b) is Run
        and a.chunk is None
        and b.chunk is None
        and b.requests.size < a.requests.size
        for a, b in pairwise(entries)
    )
    assert followed >= 5


def test_the_core_says_which_requests_are_left_decoding():
    """EngineState.left_decoding: after an entry whose every item generated, its items but the completed."""
    inst = Instance(
        (Request("A", 0, 2, 2), Request("B", 0, 3, 9), Request("C", 0, 8, 5)),
        Limits(kv_capacity=100, max_batch_tokens=8),
        TimeModel("unit"),
    )
    state = EngineState(inst, instance_cost_model(inst))
    state.step(state.make_batch(0.0, [0, 1], [2, 3]))  # both prompts finish: A and B decode now
    left = state.left_decoding()
    assert left.tolist() == [0, 1] and not left.flags.writeable
    state.step(state.make_batch(state.clock, [0, 1, 2], [1, 1, 4]))  # A completes, C is mid-prompt
    assert state.left_decoding() is None  # C did not generate
    state.step(state.make_batch(state.clock, [1, 2], [1, 4]))  # C's prompt finishes
    assert state.left_decoding().tolist() == [1, 2]
    req = state.left_decoding()
    assert state.plan_run(req)[0] == 4  # planned as decodes: C completes in the 4th batch
    state.step_run(state.make_run(state.clock, req, 4))
    assert state.left_decoding().tolist() == [1]  # C completed in the run's last batch
    assert state.__copy__().left_decoding() is None  # (a copy does not carry the last entry's facts)


def _offers(policy):
    """``policy`` counting the continuation offers it is made (in ``policy.offers``)."""
    inner = policy.continue_decodes
    policy.offers = 0

    def counted(view, requests, limit):
        policy.offers += 1
        return inner(view, requests, limit)

    policy.continue_decodes = counted
    return policy


@pytest.mark.parametrize("name", sorted(INSTANCES))
@pytest.mark.parametrize("policy", ["sarathi", "vllm", "sarathi-ef", "vllm-hy", "sarathi-nocp"])
def test_an_offer_the_policy_declines_beforehand_changes_nothing(name, policy):
    """InferMax's declines_continuations (requests wait in its queue) stands for the offers it would
    answer 0: without it the same entries, state and bookkeeping come out, with more offers made."""
    inst = INSTANCES[name]
    asked, skipped = _offers(make_policy(policy)), _offers(make_policy(policy))
    asked.declines_continuations = None  # (an instance attribute: the simulator finds no such method)
    try:
        full = simulate(inst, asked)
    except ScheduleError:
        raise
    except Exception as exc:
        with pytest.raises(type(exc)):
            simulate(inst, skipped)
        return
    fast = simulate(inst, skipped)
    assert [type(e) for e in fast.schedule.entries] == [type(e) for e in full.schedule.entries]
    assert fast.schedule.same_as(full.schedule, tol=0.0)
    assert_same_state(fast.trace.state, full.trace.state)
    for attr in BOOKS:
        a, b = _get(skipped, attr), _get(asked, attr)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, attr
    assert skipped.offers <= asked.offers


def test_declined_offers_are_not_made_while_requests_wait():
    """Everything at t = 0 under a tight M: the queue is rarely empty, so most offers are never made."""
    inst = INSTANCES["tight-unit"]
    asked, skipped = _offers(make_policy("sarathi")), _offers(make_policy("sarathi"))
    asked.declines_continuations = None
    full, fast = simulate(inst, asked), simulate(inst, skipped)
    assert fast.schedule.same_as(full.schedule, tol=0.0)
    assert skipped.offers < asked.offers
