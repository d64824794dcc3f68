"""Seed 001's batch-composition example (``shared/notes/001.md`` Sec. 2.7), batch by batch.

Requests A, B, C are decoding with 2, 4 and 3 decode tokens left; D and E (one
prompt token and one decode token each) arrive during the first batch. The
table gives the batches vLLM, Orca, FasterTransformer and Sarathi form; it is
from seed 001's later version (v3, Fig. 8), whose authors say the figure is
schematic about the budget b: Orca's row uses b = 5, the others b = 4.

In kvsched's accounting a request with p prompt tokens and d decode tokens is
(I = p, O = d + 1): the prompt generates the first token and each of the d
decodes one more. A, B and C start "already decoding", so their one-token
prompts run in a first batch (the same for every policy, before D and E
arrive); the table's rows are the batches after it. Batches last one slot
(unit time), D and E arrive at t = 1.5, and memory is unlimited, as in the
paper.

The registry's ``vllm`` (InferMax's vLLM: prefill priority, no hybrid batches,
whole prompts) and ``sarathi`` (decodes first, then prompt chunks, all within
the token budget) match the example's semantics as they are; b is the
instance's token budget C, which also caps Sarathi's P = 512.
"""

from __future__ import annotations

import pytest

from kvsched.heuristics import make_policy, simulate
from kvsched.instances.model import Instance, Limits, Request, TimeModel
from kvsched.schedule.ir import Phase, Schedule
from kvsched.schedule.validate import replay
from tests.test_stability import work_conserving_violations

#: The table of ``shared/notes/001.md`` Sec. 2.7: policy -> (b, batches).
TABLE = {
    "vllm": (4, "[Ad Bd Cd] [Dp Ep] [Ad Bd Cd Dd] [Bd Cd Ed] [Bd]"),
    "orca": (5, "[Ad Bd Cd] [Ad Bd Cd Dp Ep] [Bd Cd Dd Ed] [Bd]"),
    "fastertransformer": (4, "[Ad Bd Cd] [Ad Bd Cd] [Bd Cd] [Bd] [Dp Ep] [Dd Ed]"),
    "sarathi": (4, "[Ad Bd Cd] [Ad Bd Cd Dp] [Bd Cd Dd Ep] [Bd Ed]"),
}
WARM_UP = [{"Ap", "Bp", "Cp"}]  # A, B and C's prompts, before the table starts


def example(budget: int) -> Instance:
    decodes = {"A": 2, "B": 4, "C": 3, "D": 1, "E": 1}
    arrival = {"A": 0.0, "B": 0.0, "C": 0.0, "D": 1.5, "E": 1.5}
    reqs = tuple(Request(name, arrival[name], 1, d + 1) for name, d in decodes.items())
    return Instance(reqs, Limits(kv_capacity=10**6, max_batch_tokens=budget), TimeModel("unit"))


def parse(row: str) -> list[set[str]]:
    return [set(batch.split()) for batch in row.strip("[]").split("] [")]


def compositions(schedule: Schedule) -> list[set[str]]:
    names = "ABCDE"
    return [
        {names[i.request] + ("d" if i.phase == Phase.DECODE else "p") for i in b.items()} for b in schedule
    ]


def run(name: str, budget: int, **params) -> list[set[str]]:
    inst = example(budget)
    schedule = simulate(inst, make_policy(name, **params)).schedule
    replay(inst, schedule, strict=True)
    return compositions(schedule)


@pytest.mark.parametrize("name", list(TABLE))
def test_each_row_of_the_table_is_reproduced_exactly(name):
    budget, row = TABLE[name]
    assert run(name, budget) == WARM_UP + parse(row)


def test_no_single_budget_reproduces_every_row():
    # As the table's authors say. Orca at b = 4 puts both prompts first and has room for two
    # decodes only, so C waits a batch; at b = 5 vLLM's decode batch takes E too, and Sarathi
    # takes both prompts at once (it then coincides with Orca).
    assert run("orca", 4) == WARM_UP + parse("[Ad Bd Cd] [Ad Bd Dp Ep] [Bd Cd Dd Ed] [Bd Cd]")
    assert run("vllm", 5) == WARM_UP + parse("[Ad Bd Cd] [Dp Ep] [Ad Bd Cd Dd Ed] [Bd Cd] [Bd]")
    assert run("sarathi", 5) == WARM_UP + parse(TABLE["orca"][1])
    assert run("fastertransformer", 5) == run("fastertransformer", 4)


def test_vllm_v1_and_kfcfs_form_sarathis_batches():
    # Seed 001 Sec. 3: vLLM with chunked prefill is work-conserving like Sarathi. Running requests
    # go first in vLLM v1, and here they are exactly the decodes; K-FCFS fills by arrival.
    sarathi = WARM_UP + parse(TABLE["sarathi"][1])
    assert run("vllm-v1", 4) == sarathi
    assert run("kfcfs", 4) == sarathi
    assert run("kfcfs", 5) == WARM_UP + parse(TABLE["orca"][1])


@pytest.mark.parametrize(
    ("name", "budget", "conserving"),
    [
        ("vllm", 4, False),
        ("fastertransformer", 4, False),
        ("orca", 5, True),
        ("sarathi", 4, True),
        ("vllm-v1", 4, True),
        ("kfcfs", 4, True),
    ],
)
def test_only_orca_sarathi_and_their_kin_are_work_conserving_on_the_example(name, budget, conserving):
    inst = example(budget)
    schedule = simulate(inst, make_policy(name)).schedule
    violations = work_conserving_violations(inst, schedule, budget)
    assert (violations == []) == conserving
    if name == "vllm":
        assert violations == [2]  # [Dp Ep]: 2 tokens while A, B and C could decode
    if name == "fastertransformer":
        assert violations == [2, 3, 4]  # the cohort decodes alone while D and E's prompts wait
