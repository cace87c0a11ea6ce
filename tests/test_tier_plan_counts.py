"""``TierPlan.used`` keeps its token counts as moves are made: they must equal the sums over the
worker's programs that it stands for."""

from hypothesis import given, settings
from hypothesis import strategies as st

from maitred.runtime import Phase, Tier
from maitred.runtime.tiering import TierPlan
from tests.runtime_helpers import NOW, program, state

WORKERS = ("w0", "w1")


def summed(plan: TierPlan, worker_id: str, tier: Tier, lazy: bool) -> int:
    return sum(
        plan.weight(p)
        for p in plan.by_worker.get(worker_id, [])
        if plan.tiers[p.program_id] is tier and (lazy or p.program_id not in plan.lazy)
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from((*WORKERS, None, "gone")), st.sampled_from(list(Tier)), st.booleans(), st.integers(0, 50_000)),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(list(Tier)), st.booleans()), max_size=20),
)
def test_counts_follow_moves_and_lazy_marks(
    programs: list[tuple[str | None, Tier, bool, int]], ops: list[tuple[int, Tier, bool]]
) -> None:
    made = []
    for i, (home, tier, lazy, tokens) in enumerate(programs):
        p = program(f"p{i}", tokens=tokens, phase=Phase.REASONING, home=home, tier=tier)
        p.lazy_demote = lazy
        made.append(p)
    plan = TierPlan(state([(w, 100_000, 50_000) for w in WORKERS], made).view(NOW))
    homed = [p for p in made if p.program_id in plan.tiers]
    for i, dst, lazy in ops:
        if not homed:
            break
        p = homed[i % len(homed)]
        if lazy and p.program_id not in plan.lazy:
            plan.mark_lazy(p)
        else:
            plan.move(p, p.home_worker or "", dst)
        for w in (*WORKERS, "elsewhere"):
            for tier in Tier:
                for counted in (True, False):
                    assert plan.used(w, tier, lazy=counted) == summed(plan, w, tier, counted)
