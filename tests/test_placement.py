"""The DP against brute force and BFD (hypothesis), and TAO's worked examples."""

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from maitred.runtime import Phase, Scheduler, Tier
from maitred.runtime.placement import (
    Item,
    applicable_prefix,
    objective,
    place,
    plan_items,
    signature,
    solve_bfd,
    solve_dp,
)
from tests.runtime_helpers import NOW, program, state

QUANTA = 16


@st.composite
def instances(draw):
    m = draw(st.integers(1, 3))
    n = draw(st.integers(0, 7))
    caps = [draw(st.integers(0, 20_000)) for _ in range(m)]
    items = []
    for j in range(n):
        weight = draw(st.integers(512, 12_000))
        values = tuple(
            draw(st.one_of(st.none(), st.tuples(st.integers(0, 5000), st.integers(0, 1), st.integers(0, 8000)))) for _ in range(m)
        )
        items.append(Item(f"p{j}", weight, values))
    return items, caps


def discretised(items: list[Item], caps: list[int]) -> tuple[list[Item], list[int]]:
    quantum = max(1, math.ceil(max(caps) / QUANTA)) if max(caps) > 0 else 1
    return (
        [Item(i.key, math.ceil(i.weight / quantum), i.values) for i in items],
        [c // quantum for c in caps],
    )


def brute_force(items: list[Item], caps: list[int]) -> tuple[int, int, int]:
    best = objective(items, [None] * len(items))
    for plan in itertools.product(*[[None, *range(len(caps))] for _ in items]):
        load = [0] * len(caps)
        ok = True
        for item, b in zip(items, plan):
            if b is None:
                continue
            if item.values[b] is None:
                ok = False
                break
            load[b] += item.weight
        if ok and all(used <= c for used, c in zip(load, caps)):
            best = max(best, objective(items, list(plan)))
    return best


def feasible(items: list[Item], caps: list[int], plan) -> bool:
    load = [0] * len(caps)
    for item, b in zip(items, plan):
        if b is not None:
            assert item.values[b] is not None
            load[b] += item.weight
    return all(used <= c for used, c in zip(load, caps))


@settings(max_examples=150, deadline=None)
@given(instances())
def test_dp_equals_brute_force_never_loses_to_bfd_and_never_overfills(instance):
    items, caps = instance
    plan = solve_dp(items, caps, quanta=QUANTA, state_budget=10**6)
    assert plan is not None
    d_items, d_caps = discretised(items, caps)
    assert feasible(d_items, d_caps, plan)  # on the discretised capacities
    assert feasible(items, caps, plan)  # hence on the real ones too
    assert objective(items, plan) == brute_force(d_items, d_caps)
    assert objective(items, plan) >= objective(d_items, solve_bfd(d_items, d_caps))


@settings(max_examples=100, deadline=None)
@given(instances(), st.integers(1, 400))
def test_budgeted_plan_is_feasible_and_exact_when_the_budget_allows(instance, budget):
    items, caps = instance
    plan, partial = plan_items(items, caps, QUANTA, budget)
    assert feasible(items, caps, plan)
    if not partial:
        d_items, d_caps = discretised(items, caps)
        assert objective(items, plan) == brute_force(d_items, d_caps)


def test_state_budget_exceeded_returns_none_for_bfd_to_take_over():
    items = [Item(f"p{j}", 600, ((1, 1, 1), (1, 1, 1), (1, 1, 1))) for j in range(8)]
    assert solve_dp(items, [10_000] * 3, quanta=64, state_budget=50) is None


def test_dp_admits_the_long_program_a_short_first_greedy_defers():
    """TAO Figure 11 in miniature. One worker with 10,000 free tokens; three short programs of
    3,000 (no cache there) and one long program of 9,500 whose 6,000-token prefix is still cached
    on that worker. Credit comes first, so the DP takes the long program (k = 6,000), where a
    short-first heuristic fills the worker with the three short ones (k = 0)."""
    items = [Item(f"s{j}", 3_000, ((0, 1, 2_500),)) for j in range(3)]
    items.append(Item("long", 9_500, ((6_000, 1, 9_000),)))
    plan = solve_dp(items, [10_000], quanta=64, state_budget=10_000)
    assert plan == [None, None, None, 0]
    assert objective(items, plan) == (6_000, 1, 9_000)


def test_returning_program_goes_back_to_the_worker_holding_its_cache_not_the_emptiest():
    """p returns from a 4 s tool with context 6,000 tokens; its prefix (6,000 tokens, seen 2 s ago:
    k = round(6000·2^-0.2) = 5,223) sits on w0, which has 8,000 tokens free; w1 is empty (40,000
    free). Lexicographic value: (5223, 1, 6000) on w0 against (0, 1, 6000) on w1, so w0."""
    busy = program("busy", tokens=31_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
    p = program("p", tokens=6_000, returned=True, cached_on={"w0": (6_000, 2.0)})
    st = state([("w0", 40_000, 0), ("w1", 40_000, 0)], [busy, p])
    decision = Scheduler(st, "tao").tick(NOW)
    (a,) = decision.assignments
    assert (a.program_id, a.worker) == ("p", "w0")
    assert "p" in decision.admitted
    assert st.programs["p"].home_worker == "w0"


def test_plan_recheck_applies_the_longest_prefix_that_still_holds():
    a = program("a", tokens=3_000, returned=True)
    b = program("b", tokens=3_000, returned=True)
    c = program("c", tokens=3_000, returned=True)
    st = state([("w0", 20_000, 0)], [a, b, c])
    view = st.view(NOW)
    plan = place(view, [a, b, c], {"w0": 20_000}).assignments
    assert len(plan) == 3
    assert applicable_prefix(plan, view, {"w0": 20_000}) == plan
    assert applicable_prefix(plan, view, {"w0": 7_100}) == plan[:2]  # live capacity shrank (weights 3,512)
    st.programs[plan[1].program_id].context_tokens += 100  # the second program changed since planning
    assert applicable_prefix(plan, st.view(NOW), {"w0": 20_000}) == plan[:1]
    assert signature(st.programs["a"]) == signature(a)
