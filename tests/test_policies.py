"""Tiering invariants (hypothesis) and a worked example per paper mechanism."""

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maitred.events import Handoff, LLMEnd, LLMStart, ProgramStart
from maitred.runtime import POLICIES, Phase, Scheduler, SignalConfig, Tier, make_policy
from maitred.runtime.core import RuntimeCore
from maitred.runtime.policies.maitred import OVERDUE_S
from maitred.runtime.records import WorkerState
from maitred.runtime.tiering import plan_tiers, working_set_capacity
from tests.runtime_helpers import NOW, program, state

RESERVE = SignalConfig().reserve_tokens
#: No overcommit: with host memory the size of the GPU, maitred's GPU tier is the GPU (the
#: worked examples below are about the order of demotion, not the tier's size).
TIGHT = SignalConfig(overcommit_headroom=0.0)


def used(st, worker, tier, decision=None):
    lazy = {m.program_id for m in decision.tier_moves if m.lazy} if decision else set()
    return sum(
        p.context_tokens + RESERVE
        for p in st.programs.values()
        if p.home_worker == worker and p.tier is tier and p.program_id not in lazy
    )


@st.composite
def tiered_states(draw):
    workers = [(f"w{i}", draw(st.integers(2_000, 30_000)), draw(st.integers(0, 30_000))) for i in range(draw(st.integers(1, 3)))]
    programs = []
    for j in range(draw(st.integers(0, 12))):
        phase = draw(st.sampled_from(list(Phase)))
        programs.append(
            program(
                f"p{j}",
                tokens=draw(st.integers(0, 9_000)),
                phase=phase,
                home=draw(st.sampled_from([w for w, _, _ in workers])),
                tier=draw(st.sampled_from(list(Tier))),
                cycles=[(draw(st.floats(0.1, 30)), draw(st.floats(0, 60)))],
                returned=draw(st.booleans()) and phase is Phase.ACTING,
            )
        )
    return workers, programs


@settings(max_examples=200, deadline=None)
@given(tiered_states())
@pytest.mark.parametrize("policy", ["mori", "maitred"])
def test_tiering_never_leaves_a_tier_over_capacity(policy, case):
    """After a step, GPU use (not counting programs marked for lazy demotion, which leave when
    their step ends) and host use are within capacity on every worker; for maitred the GPU
    tier's capacity is its working-set ceiling at the start of the step."""
    workers, programs = case
    st_ = state(workers, programs)
    tier_caps = working_set_capacity(st_.view(NOW)) if policy == "maitred" else None
    decision = Scheduler(st_, policy).tick(NOW)
    for worker, gpu, cpu in workers:
        cap = tier_caps[worker].ceiling if tier_caps else gpu
        assert used(st_, worker, Tier.GPU, decision) <= cap
        assert used(st_, worker, Tier.CPU) <= cpu


@settings(max_examples=200, deadline=None)
@given(tiered_states())
def test_tiering_moves_nothing_down_while_capacities_hold(case):
    workers, programs = case
    st_ = state(workers, programs)
    caps = {w: (g, c) for w, g, c in workers}
    holds = all(used(st_, w, Tier.GPU) <= g and used(st_, w, Tier.CPU) <= c for w, (g, c) in caps.items())
    plan = plan_tiers(st_.view(NOW), promote_waiting=True)
    if holds:
        order = [Tier.WAITING, Tier.CPU, Tier.GPU]
        assert all(order.index(m.dst) > order.index(m.src) for m in plan.moves)  # promotions only
        promoted = {m.program_id for m in plan.moves}
        assert all(
            st_.programs[pid].returned
            or st_.programs[pid].phase is not Phase.ACTING
            or st_.view(NOW).signals[pid].readiness.r == 1
            for pid in promoted
        )


def test_gpu_over_capacity_demotes_the_most_idle_acting_program():
    """w0 holds 3 programs of 3,488 (+512) tokens = 12,000 in a 10,000-token GPU tier. a is acting
    with ι = 0.9, b acting with ι = 0.5, c reasoning with ι = 0.95: a (the most idle *acting*
    program) goes to host memory; c is mid-step and stays."""
    a = program("a", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 3)
    b = program("b", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(5, 5)] * 3)
    c = program("c", tokens=3_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(0.5, 9.5)] * 3)
    for p in (a, b, c):
        p.phase_since = NOW
    st_ = state([("w0", 10_000, 10_000)], [a, b, c], TIGHT)
    decision = Scheduler(st_, "maitred").tick(NOW)
    assert [(m.program_id, m.dst, m.lazy) for m in decision.tier_moves] == [("a", Tier.CPU, False)]
    assert st_.programs["a"].tier is Tier.CPU and "a" not in decision.admitted


def test_maitred_demotes_by_idleness_per_token_where_mori_demotes_by_idleness():
    """w0's GPU tier holds 12,000 tokens in a 10,000 one. big: 7,488 (+512) tokens, ι = 0.9;
    small: 1,488 (+512), ι = 0.8; busy: 1,488 (+512), reasoning. MORI demotes the most idle
    (big, ι 0.9). maitred ranks ι per token: small 0.8/2,000 = 4.0e-4 beats big 0.9/8,000 =
    1.1e-4, so small goes first; its 2,000 tokens cover the 2,000 over capacity and big stays."""

    def case():
        big = program("big", tokens=7_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4)
        small = program("small", tokens=1_488, home="w0", tier=Tier.GPU, cycles=[(2, 8)] * 4)
        busy = program("busy", tokens=1_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
        for p in (big, small):
            p.phase_since = NOW
        return state([("w0", 10_000, 10_000)], [big, small, busy], TIGHT)

    assert [m.program_id for m in Scheduler(case(), "mori").tick(NOW).tier_moves] == ["big"]
    assert [m.program_id for m in Scheduler(case(), "maitred").tick(NOW).tier_moves] == ["small"]


def test_working_set_capacity_follows_the_busy_share_up_to_what_gpu_and_host_keep():
    """Four programs of 9,488 (+512) tokens in w0's GPU tier (10,000 GPU tokens). All
    reasoning with no history (ι = 0): busy share 1, the tier is 0.9 / 1 → at least the GPU,
    so 10,000. All acting with ι = 0.75: busy share 0.25, 0.9 / 0.25 = 3.6, capped at
    max(1, host / GPU) + headroom: 2 + 0.4 = 2.4 with 20,000 host tokens, 1.4 with none."""

    def tier(phase, cycles, host):
        ps = [program(f"p{i}", tokens=9_488, phase=phase, home="w0", tier=Tier.GPU, cycles=cycles) for i in range(4)]
        for p in ps:
            p.phase_since = NOW
        c = working_set_capacity(state([("w0", 10_000, host)], ps).view(NOW))["w0"]
        return c.fill, c.ceiling

    assert tier(Phase.REASONING, [], 20_000) == (10_000, 10_000)
    assert tier(Phase.ACTING, [(1, 3)] * 4, 20_000) == (24_000, 24_000)
    assert tier(Phase.ACTING, [(1, 3)] * 4, 0) == (14_000, 14_000)
    half = [program(f"h{i}", tokens=1_488, phase=Phase.ACTING, home="w0", tier=Tier.GPU, cycles=[(1, 1)] * 4) for i in range(2)]
    for p in half:
        p.phase_since = NOW
    c = working_set_capacity(state([("w0", 10_000, 20_000)], half).view(NOW))["w0"]
    assert (c.fill, c.ceiling) == (18_000, 20_000)  # 0.9 / 0.5 and 1 / 0.5


def test_programs_of_one_agent_on_a_write_through_worker_share_its_prefix_once_in_the_tier():
    """Three reasoning programs of one agent (busy share 1) in w0's GPU tier, 9,000 of each
    one's context the agent's system prompt. The worker caches that prefix once, so the tier
    holds 2 × 9,000 more than the weights say; a program of another agent shares nothing. With
    write-back (host memory below twice the GPU) no credit is given: there every admission the
    credit allows costs an eviction the scheduler waits for."""

    def tier(write_back: bool, agents: list[str]) -> int:
        ps = [
            program(f"p{i}", tokens=12_000, phase=Phase.REASONING, home="w0", tier=Tier.GPU, agent=a)
            for i, a in enumerate(agents)
        ]
        st_ = state([("w0", 40_000, 40_000)], ps)
        st_.workers["w0"].write_back = write_back
        st_.agent_prefix_tokens.update({"claude-code": 9_000, "other": 9_000})
        return working_set_capacity(st_.view(NOW))["w0"].fill

    base = tier(False, [])
    assert tier(False, ["claude-code"] * 3) == base + 2 * 9_000
    assert tier(False, ["claude-code", "claude-code", "other"]) == base + 9_000
    assert tier(True, ["claude-code"] * 3) == tier(True, [])


def test_an_agents_prefix_is_its_shortest_first_prompt():
    """Each first prompt is the agent's system prompt plus the program's own task."""
    st_ = state([("w0", 100_000, 0)], [])
    for pid, tokens in (("a", 10_700), ("b", 9_400), ("c", 12_000)):
        st_.request_arrived(pid, NOW, agent="claude-code", prompt_tokens=tokens)
    assert st_.agent_prefix_tokens["claude-code"] == 9_400


def test_an_agents_prefix_is_learned_when_its_agent_comes_after_the_first_request():
    """Through the gateway a request names no agent; the middleware's ``program.start`` that
    does can come after the first request, even after the second: the first prompt is what the
    agent's prefix is learned from, whenever the agent becomes known."""
    st_ = state([("w0", 100_000, 0)], [])
    st_.request_arrived("a", NOW, agent=None, prompt_tokens=10_700)
    assert "claude-code" not in st_.agent_prefix_tokens
    st_.apply(ProgramStart(ts=NOW, program_id="a", agent="claude-code"))
    assert st_.agent_prefix_tokens["claude-code"] == 10_700
    st_.request_arrived("b", NOW, agent=None, prompt_tokens=9_400)
    st_.apply(LLMEnd(ts=NOW + 1, program_id="b", request_id="r", prompt_tokens=9_400, completion_tokens=100))
    st_.request_arrived("b", NOW + 2, agent=None, prompt_tokens=9_900)
    st_.apply(ProgramStart(ts=NOW + 2, program_id="b", agent="claude-code"))
    assert st_.agent_prefix_tokens["claude-code"] == 9_400


def test_with_write_back_the_host_pool_adds_to_the_gpu_in_the_tier_cap():
    """The same four acting programs (busy share 0.25, 0.9 / 0.25 = 3.6). With write-through a
    host pool the size of the GPU only mirrors it (cap 1 + 0.4 headroom); with write-back it
    holds what left the GPU (cap 1 + 1 + 0.4)."""

    def fill(write_back: bool) -> int:
        ps = [program(f"p{i}", tokens=9_488, phase=Phase.ACTING, home="w0", tier=Tier.GPU, cycles=[(1, 3)] * 4) for i in range(4)]
        for p in ps:
            p.phase_since = NOW
        st_ = state([("w0", 10_000, 10_000)], ps)
        st_.workers["w0"].write_back = write_back
        return working_set_capacity(st_.view(NOW))["w0"].fill

    assert (fill(False), fill(True)) == (14_000, 24_000)


def test_maitred_demotes_only_above_its_ceiling_and_only_down_to_it():
    """w0: 10,000 GPU and 20,000 host tokens; five acting programs of 3,488 (+512) with ι = 0.5
    (busy share 0.5): fill 18,000, ceiling 20,000. At 20,000 (all five) nothing moves: the band
    absorbs it where filling stops at 18,000. A sixth, reasoning program of 1,488 (+512) brings the
    share to (10,000 + 2,000) / 22,000 and the ceiling to 10,000 / 0.545 = 18,333: one program
    (the most idle per token) goes, leaving 18,000, not down to the fill level."""

    def case(extra):
        ps = [program(f"p{i}", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(1, 1)] * 4) for i in range(5)]
        if extra:
            ps.append(program("busy", tokens=1_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU))
        for p in ps:
            p.phase_since = NOW
        return state([("w0", 10_000, 20_000)], ps)

    assert not Scheduler(case(False), "maitred").tick(NOW).tier_moves
    moves = Scheduler(case(True), "maitred").tick(NOW).tier_moves
    assert [(m.dst, m.lazy) for m in moves] == [(Tier.CPU, False)]


def test_maitred_admits_beyond_the_gpu_when_its_programs_mostly_wait_where_mori_holds():
    """w0 (10,000 GPU, 20,000 host tokens) has two GPU-tier programs of 4,488 (+512), both in long
    tools (ι = 0.9): the GPU tier is full. A new program of 3,488 (+512) asks for the GPU. MORI's
    tier is the GPU: the newcomer squeezes out one idle program (displacement), whose next
    request will be held. maitred's tier is sized by the busy share (0.1 → capped at 2.4 × the
    GPU): all three stay admitted, and the idle programs' KV leaves the GPU only if the engine
    needs the room (its host copy is already there)."""

    def case():
        idle = [program(f"i{k}", tokens=4_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4) for k in range(2)]
        for p in idle:
            p.phase_since = NOW
        new = program("new", tokens=3_488, phase=Phase.REASONING)
        return state([("w0", 10_000, 20_000)], [*idle, new])

    ours = Scheduler(case(), "maitred").tick(NOW)
    assert ours.admitted == {"i0", "i1", "new"} and not ours.tier_moves
    mori = Scheduler(case(), "mori").tick(NOW)
    assert "new" in mori.admitted and [(m.program_id, m.dst) for m in mori.tier_moves] == [("i0", Tier.CPU)]


@settings(max_examples=200, deadline=None)
@given(tiered_states())
def test_without_overcommit_maitred_keeps_its_gpu_tier_within_the_gpu(case):
    """Host memory the size of the GPU and no headroom: maitred's tier may not exceed the GPU."""
    workers, programs = case
    workers = [(w, gpu, gpu) for w, gpu, _ in workers]
    st_ = state(workers, programs, TIGHT)
    caps = working_set_capacity(st_.view(NOW))
    assert all(c.fill == gpu and c.ceiling == gpu for (w, gpu, _), c in zip(workers, caps.values()))
    decision = Scheduler(st_, "maitred").tick(NOW)
    for worker, gpu, _ in workers:
        assert used(st_, worker, Tier.GPU, decision) <= gpu


def test_maitred_places_a_new_program_at_arrival_only_into_room_free_now():
    """w0: 10,000 GPU and 10,000 host tokens. a (8,000, idle) and b (7,000, busy, mid-step)
    already hold 15,000, more than the tier's 14,000 cap: a newcomer of 5,000 would need a
    demotion first, and does not fit beside b's running request either, so it waits for the step
    (placing it at arrival would leave the tier at 20,000). With b gone,
    a alone (busy share 0.1) leaves 6,000 free in the 14,000 tier: the newcomer is placed at
    once — but not while another program waits for the GPU outside its tier. The tier is the
    size the last step planned (``tier_tokens``), so the arrival rule reads no other program."""

    def case(*, with_b=True, waiting=False):
        a = program("a", tokens=7_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4)
        b = program("b", tokens=6_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(9, 1)] * 4)
        held = program("held", tokens=488, phase=Phase.REASONING, home="w0", tier=Tier.CPU)
        new = program("new", tokens=4_488, phase=Phase.REASONING)
        ps = [a, new] + ([b] if with_b else []) + ([held] if waiting else [])
        for p in ps:
            p.phase_since = NOW
        st_ = state([("w0", 10_000, 10_000)], ps)
        st_.tier_tokens["w0"] = working_set_capacity(st_.view(NOW))["w0"].fill  # what a step plans
        return st_.view(NOW, lazy=True)

    policy = make_policy("maitred")
    assert policy.admit_at_arrival(case(), "new") is None
    placed = policy.admit_at_arrival(case(with_b=False), "new")
    assert placed is not None and [(a.program_id, a.worker) for a in placed.assignments] == [("new", "w0")]
    assert placed.admitted == {"new"} and not placed.tier_moves
    assert policy.admit_at_arrival(case(with_b=False, waiting=True), "new") is None


def test_maitred_admits_beside_the_running_requests_of_a_write_through_worker():
    """w0: 20,000 GPU and 40,000 host tokens (write-through: every GPU block has a host copy),
    its GPU tier over full with idle programs (six of 3,488 +512 in a tier of 20,000 before any
    step). A newcomer of 4,000 and a program back from its tool whose KV was demoted (4,000), both
    of agent coder, go at once: nothing runs on w0, and the idle KV leaves the GPU for nothing.
    Beside three running requests of coder (3 × 5,488, its 4,000-token system prompt counted once:
    8,464 running, and the two need 512 each, their prompt's prefix being there) they still fit
    18,000 (0.9 of the GPU); beside three of other agents (16,464 running, 4,000 each) they do
    not, and wait for a step. On a write-back worker they wait: an eviction there is a
    copy the scheduler waits for; nor on a worker whose host memory is smaller than its GPU (a
    block may have no host copy)."""

    def case(*, running_agents=(), write_back=False, host=40_000):
        idle = [program(f"i{k}", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4) for k in range(6)]
        busy = [
            program(f"r{k}", tokens=5_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, agent=agent)
            for k, agent in enumerate(running_agents)
        ]
        new = program("new", tokens=3_488, phase=Phase.REASONING, agent="coder")
        back = program("back", tokens=3_488, phase=Phase.REASONING, home="w0", tier=Tier.CPU, cycles=[(1, 9)] * 4)
        ps = [*idle, *busy, new, back]
        for p in ps:
            p.phase_since = NOW
        st_ = state([("w0", 20_000, host)], ps)
        st_.workers["w0"].write_back = write_back
        st_.agent_prefix_tokens.update(dict.fromkeys(("coder", "tester", "planner", "reviewer"), 4_000))
        return st_.view(NOW, lazy=True)

    policy = make_policy("maitred")
    for agents, admitted in (((), True), (("coder",) * 3, True), (("tester", "planner", "reviewer"), False)):
        back = policy.admit_at_arrival(case(running_agents=agents), "back")
        assert (back is not None) is admitted, agents
        if back is not None:
            assert [(m.program_id, m.dst) for m in back.tier_moves] == [("back", Tier.GPU)] and back.admitted == {"back"}
        view = case(running_agents=agents)
        view.totals.wanting_off_gpu -= 1  # "back" alone would make the newcomer jump a queue
        new = policy.admit_at_arrival(view, "new")
        assert (new is not None) is admitted, agents
        if new is not None:
            assert [(a.program_id, a.worker) for a in new.assignments] == [("new", "w0")]
    assert policy.admit_at_arrival(case(write_back=True), "back") is None
    assert policy.admit_at_arrival(case(host=10_000), "back") is None


def test_the_live_state_admits_at_once_within_the_tier_maitred_planned_beyond_the_gpu():
    """After a maitred step sized w0's tier beyond its 10,000-token GPU (two idle programs of
    4,488 +512 and one of 7,488 +512 that has just started a step: busy share 0.1), a host-tier
    program of 1,488 (+512) whose tool just returned is admitted at once by maitred's arrival
    rule (``RuntimeCore.arrive``, both drivers' path, no wait for a step): 20,000 planned in a
    24,000-token tier. Before any step the tier is the GPU, the request does not fit beside the
    running one either, and it is held."""

    def case():
        idle = [program(f"i{k}", tokens=4_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4) for k in range(2)]
        running = program("run", tokens=7_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4)
        back = program("back", tokens=1_488, home="w0", tier=Tier.CPU, cycles=[(1, 9)] * 4)
        for p in (*idle, running, back):
            p.phase_since = NOW
        return state([("w0", 10_000, 20_000)], [*idle, running, back])

    fresh = case()
    assert RuntimeCore(fresh, "maitred").arrive("back", NOW + 1).worker is None
    st_ = case()
    core = RuntimeCore(st_, "maitred")
    result = core.step(NOW)
    assert result.decision.tier_tokens == {"w0": 24_000} and st_.tier_tokens == {"w0": 24_000}
    assert core.arrive("back", NOW + 1).worker == "w0" and st_.programs["back"].tier is Tier.GPU


def test_the_plan_recheck_holds_maitreds_assignments_to_the_tier_it_planned():
    """The gateway plans on a snapshot and re-checks before applying. w0: 10,000 GPU and 20,000
    host tokens; two idle programs of 4,488 (+512) size the tier at 24,000; a newcomer of 9,488
    (+512) is placed beyond the GPU. Applied as planned, it stands; if meanwhile i0 grew by 8,000
    tokens (28,000 in a 24,000 tier), the re-check voids it and the newcomer is held."""

    def plan(grow: int):
        idle = [program(f"i{k}", tokens=4_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 4) for k in range(2)]
        new = program("new", tokens=9_488, phase=Phase.REASONING)
        for p in (*idle, new):
            p.phase_since = NOW
        st_ = state([("w0", 10_000, 20_000)], [*idle, new])
        sched = Scheduler(st_, "maitred")
        planned = st_.snapshot().view(NOW)
        decision = sched.plan(planned)
        assert [a.program_id for a in decision.assignments] == ["new"] and decision.tier_tokens == {"w0": 24_000}
        st_.programs["i0"].context_tokens += grow
        st_.touch("i0")  # a direct change to a program record is announced, as the state's own handlers do
        return sched.apply(decision, planned)

    assert [a.program_id for a in plan(0).assignments] == ["new"]
    voided = plan(8_000)
    assert not voided.assignments and "new" in voided.held


def test_maitred_brings_back_the_smallest_waiting_program_first_where_mori_takes_the_least_idle():
    """5,000 free GPU tokens on w0, nothing else in its GPU tier, and two host-tier programs that
    want the GPU now: big (3,488 +512, ι = 0.2) and small (1,488 +512, ι = 0.8), beside a
    reasoning filler of 2,488 (+512) in a 7,000-token GPU: 4,000 free, room for big alone, or
    for small with 2,000 to spare that big does not fit. MORI takes the least idle (big),
    maitred the smallest (small). TIGHT keeps maitred's tier at the GPU."""

    def case():
        big = program("big", tokens=3_488, home="w0", tier=Tier.CPU, returned=True, cycles=[(8, 2)])
        small = program("small", tokens=1_488, home="w0", tier=Tier.CPU, returned=True, cycles=[(2, 8)])
        filler = program("filler", tokens=2_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
        for p in (big, small):
            p.phase_since = NOW
        return state([("w0", 7_000, 7_000)], [big, small, filler], TIGHT)

    assert [m.program_id for m in Scheduler(case(), "mori").tick(NOW).tier_moves] == ["big"]
    assert [m.program_id for m in Scheduler(case(), "maitred").tick(NOW).tier_moves] == ["small"]


def test_maitred_holds_room_for_a_new_program_whose_first_request_is_overdue():
    """4,000 free GPU tokens on w0 (a 7,000-token GPU, a reasoning filler of 2,488 +512) and
    two programs that want them: a host-tier one returning (2,488 +512), and a new one (2,488
    +512) whose first request arrived ``age`` seconds ago. Only one fits. A fresh newcomer
    waits for placement behind the returning program, as before; one held over OVERDUE_S is
    placed first and the returning program waits."""

    def case(age: float):
        back = program("back", tokens=2_488, home="w0", tier=Tier.CPU, returned=True, cycles=[(2, 8)])
        new = program("new", tokens=2_488, phase=Phase.REASONING)
        new.phase_since = NOW - age
        filler = program("filler", tokens=2_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
        return state([("w0", 7_000, 7_000)], [back, new, filler], TIGHT)

    fresh = Scheduler(case(1.0), "maitred").tick(NOW)
    assert [m.program_id for m in fresh.tier_moves] == ["back"] and fresh.assignments == ()
    overdue = Scheduler(case(OVERDUE_S + 1), "maitred").tick(NOW)
    assert overdue.tier_moves == () and [a.program_id for a in overdue.assignments] == ["new"]


def test_room_held_for_an_overdue_program_that_does_not_fit_yet_is_kept_from_promotions_only():
    """A 7,000-token GPU with a 3,000-token reasoning filler: 4,000 free. big (new, overdue,
    5,000) does not fit yet; back (returning from host memory, 1,000) is not promoted into the
    room held for big, but small (new, arrived 1 s ago, 3,000) is placed in it."""
    big = program("big", tokens=4_488, phase=Phase.REASONING)
    big.phase_since = NOW - (OVERDUE_S + 100)
    small = program("small", tokens=2_488, phase=Phase.REASONING)
    small.phase_since = NOW - 1
    back = program("back", tokens=488, home="w0", tier=Tier.CPU, returned=True, cycles=[(2, 8)])
    filler = program("filler", tokens=2_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
    decision = Scheduler(state([("w0", 7_000, 7_000)], [big, small, back, filler], TIGHT), "maitred").tick(NOW)
    assert decision.tier_moves == () and [a.program_id for a in decision.assignments] == ["small"]


def test_all_reasoning_marks_the_most_idle_for_lazy_demotion_then_moves_it_after_its_step():
    a = program("a", tokens=5_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 3)
    b = program("b", tokens=5_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(5, 5)] * 3)
    st_ = state([("w0", 10_000, 10_000)], [a, b], TIGHT)
    sched = Scheduler(st_, "maitred")
    decision = sched.tick(NOW)
    assert [(m.program_id, m.lazy) for m in decision.tier_moves] == [("a", True)]
    assert st_.programs["a"].tier is Tier.GPU and st_.programs["a"].lazy_demote
    st_.apply(LLMEnd(ts=NOW + 1, program_id="a", request_id="r", prompt_tokens=5_400, completion_tokens=88))
    decision = sched.tick(NOW + 1)
    assert [(m.program_id, m.dst, m.lazy) for m in decision.tier_moves] == [("a", Tier.CPU, False)]


def test_host_over_capacity_drops_the_most_idle_to_waiting():
    a = program("a", tokens=4_000, home="w0", tier=Tier.CPU, cycles=[(1, 99)])
    b = program("b", tokens=4_000, home="w0", tier=Tier.CPU, cycles=[(5, 5)])
    st_ = state([("w0", 10_000, 6_000)], [a, b])
    decision = Scheduler(st_, "mori").tick(NOW)
    assert ("a", Tier.WAITING) in [(m.program_id, m.dst) for m in decision.tier_moves]
    assert st_.programs["b"].tier is Tier.CPU


def test_promotion_brings_back_returned_programs_least_idle_first_then_ready_ones():
    """6,000 free GPU tokens on w0 and three host-tier programs of 2,488 (+512) tokens: r returned
    with ι = 0.2, s returned with ι = 0.8, t still in its tool but predicted back (r = 1 by ETA).
    Room for two: r, then s; t waits."""
    r = program("r", tokens=2_488, home="w0", tier=Tier.CPU, returned=True, cycles=[(8, 2)])
    s = program("s", tokens=2_488, home="w0", tier=Tier.CPU, returned=True, cycles=[(2, 8)])
    t = program("t", tokens=2_488, home="w0", tier=Tier.CPU, cycles=[(9, 1)])
    t.tool.eta_s, t.tool.eta_at = 0.2, NOW
    for p in (r, s, t):
        p.phase_since = NOW
    st_ = state([("w0", 6_000, 20_000)], [r, s, t])
    decision = Scheduler(st_, "mori").tick(NOW)
    assert [(m.program_id, m.dst) for m in decision.tier_moves] == [("r", Tier.GPU), ("s", Tier.GPU)]
    assert st_.programs["t"].tier is Tier.CPU


def test_demoted_program_comes_back_to_its_home_worker():
    p = program("p", tokens=3_000, home="w1", tier=Tier.CPU, returned=True)
    st_ = state([("w0", 50_000, 50_000), ("w1", 10_000, 50_000)], [p])
    Scheduler(st_, "maitred").tick(NOW)
    assert (st_.programs["p"].home_worker, st_.programs["p"].tier) == ("w1", Tier.GPU)


def test_thunderagent_pauses_acting_programs_smallest_first_and_resumes_by_bfd():
    small = program("small", tokens=1_488, home="w0", tier=Tier.GPU)
    big = program("big", tokens=3_988, home="w0", tier=Tier.GPU)
    busy = program("busy", tokens=4_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
    st_ = state([("w0", 10_000, 0)], [small, big, busy])
    decision = Scheduler(st_, "thunderagent").tick(NOW)
    assert [m.program_id for m in decision.tier_moves] == ["small"]  # 11,500 > 10,000: the smallest acting one goes
    st_.programs["small"].returned = True
    st_.programs["small"].tool = None
    st_.add_worker(WorkerState("w1", gpu_tokens=20_000))
    decision = Scheduler(st_, "thunderagent").tick(NOW + 1)
    assert [(a.program_id, a.worker) for a in decision.assignments] == [("small", "w1")]


def test_handoff_consumer_is_prefilled_on_an_idle_worker_and_not_on_a_busy_one():
    """planner hands off to coder with 3,000 tokens of shared messages; the coder agent's prompt
    prefix was learned as 1,200 tokens, so the warmup is 4,200 tokens (LOCAL), admitted only
    while w0 has no queued foreground request."""
    st_ = state([("w0", 100_000, 0)], [])
    st_.request_arrived("other", NOW - 50, agent="coder", prompt_tokens=1_200)
    st_.request_arrived("p", NOW - 10, agent="planner", prompt_tokens=2_000)
    st_.apply(LLMEnd(ts=NOW - 5, program_id="p", request_id="r", prompt_tokens=2_000, completion_tokens=50, worker="w0"))
    sched = Scheduler(st_, "maitred")
    sched.tick(NOW - 5)
    st_.apply(Handoff(ts=NOW, program_id="p", agent="planner", from_agent="planner", to_agent="coder", context_tokens=3_000))
    st_.prompts.handoff.add("p")  # the driver holds the consumer's prompt (the replay always does)
    decision = sched.tick(NOW)
    assert [(w.program_id, w.worker, w.tokens, w.kind) for w in decision.warmups] == [("p", "w0", 4_200, "handoff")]
    st_.workers["w0"].queued_requests = 3
    assert sched.tick(NOW + 1).warmups == ()
    st_.workers["w0"].queued_requests = 0
    st_.apply(LLMStart(ts=NOW + 2, program_id="p", agent="coder", request_id="r2", prompt_tokens=4_300))
    assert [w.kind for w in sched.tick(NOW + 2).warmups] == []  # the real request overtook it


def test_program_about_to_return_from_host_memory_is_loaded_back_ahead_of_its_request():
    p = program("p", tokens=8_000, home="w0", tier=Tier.CPU, returned=True)
    st_ = state([("w0", 100_000, 100_000)], [p])
    decision = Scheduler(st_, "maitred").tick(NOW)
    assert [(w.program_id, w.kind, w.tokens) for w in decision.warmups] == [("p", "load_back", 8_000)]


@pytest.mark.parametrize("name", list(POLICIES))
def test_a_policy_step_never_mutates_the_state_it_reads(name):
    programs = [
        program("a", tokens=5_000, home="w0", tier=Tier.GPU, cycles=[(1, 4)]),
        program("b", tokens=7_000, phase=Phase.REASONING, cycles=[(2, 2)]),
        program("c", tokens=3_000, home="w1", tier=Tier.CPU, returned=True),
    ]
    st_ = state([("w0", 8_000, 8_000), ("w1", 8_000, 8_000)], programs)
    before = copy.deepcopy(st_.programs)
    view = st_.view(NOW)
    make_policy(name).step(view)
    assert st_.programs == before


def test_a_failing_policy_degrades_to_plain_routing():
    class Broken:
        name = "broken"

        def step(self, view):
            raise RuntimeError("bug")

    st_ = state([("w0", 8_000, 0)], [program("a", phase=Phase.REASONING)])
    sched = Scheduler(st_, Broken())
    decision = sched.tick(NOW)
    assert decision.policy == "round_robin" and "a" in decision.admitted and sched.failures == 1


def test_unknown_policy_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="choose one of: maitred, mori, tao"):
        make_policy("fifo")


def test_dead_worker_programs_are_replaced_elsewhere():
    p = program("p", tokens=2_000, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cached_on={"w0": (2_000, 1)})
    st_ = state([("w0", 10_000, 0), ("w1", 10_000, 0)], [p])
    st_.set_worker_health("w0", False)
    decision = Scheduler(st_, "maitred").tick(NOW)
    assert [(a.program_id, a.worker, a.reason) for a in decision.assignments] == [("p", "w1", "new")]
