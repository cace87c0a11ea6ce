"""The runtime core's side of the live service: snapshots, the plan re-check, admission at once."""

from maitred.events import LLMEnd, LLMStart, ProgramEnd, ToolEnd, ToolStart
from maitred.runtime import Phase, Scheduler, Tier
from maitred.runtime.core import RuntimeCore
from maitred.runtime.decisions import Assignment, Decision, TierMove
from maitred.runtime.placement import signature
from tests.runtime_helpers import NOW, program, state


def test_snapshot_is_isolated_from_later_changes():
    st = state([("w0", 10_000, 0)], [program("a", tokens=1_000, home="w0", tier=Tier.GPU)])
    snap = st.snapshot()
    st.apply(LLMStart(ts=NOW + 1, program_id="a", request_id="r", prompt_tokens=3_000))
    st.apply(ToolStart(ts=NOW + 2, program_id="b", call_id="c", tool="grep"))
    st.workers["w0"].healthy = False
    assert snap.programs["a"].context_tokens == 1_000 and snap.programs["a"].phase is Phase.ACTING
    assert "b" not in snap.programs and snap.workers["w0"].healthy
    later = st.snapshot()
    assert later.programs["a"].context_tokens == 3_000 and "b" in later.programs


def test_snapshot_copies_only_what_changed():
    st = state([("w0", 10**9, 0)], [program(f"p{i}", home="w0", tier=Tier.GPU) for i in range(1_000)])
    first = st.snapshot()
    st.apply(LLMStart(ts=NOW + 1, program_id="p7", request_id="r", prompt_tokens=10))
    st.apply(ProgramEnd(ts=NOW + 1, program_id="p8"))
    second = st.snapshot()
    shared = sum(first.programs[pid] is second.programs[pid] for pid in second.programs)
    assert shared == 998 and "p8" not in second.programs
    assert second.programs["p7"] is not first.programs["p7"] and second.programs["p7"].context_tokens == 10


def test_snapshot_history_follows_recorded_tools():
    st = state([("w0", 10_000, 0)], [])
    for i in range(6):
        st.apply(ToolStart(ts=NOW + i, program_id="a", call_id=f"c{i}", tool="pytest"))
        st.apply(ToolEnd(ts=NOW + i + 0.5, program_id="a", call_id=f"c{i}"))
    snap = st.snapshot()
    st.apply(ToolStart(ts=NOW + 10, program_id="a", call_id="c9", tool="pytest"))
    st.apply(ToolEnd(ts=NOW + 12, program_id="a", call_id="c9"))
    assert snap.history.by_tool["pytest"].n == 6 and st.history.by_tool["pytest"].n == 7
    assert st.snapshot().history.by_tool["pytest"].n == 7


def test_plan_on_a_snapshot_then_apply_voids_what_changed_meanwhile():
    a = program("a", tokens=3_000, phase=Phase.REASONING)
    b = program("b", tokens=3_000, phase=Phase.REASONING)
    st = state([("w0", 10_000, 0)], [a, b])
    sched = Scheduler(st, "maitred")
    snap = st.snapshot()
    view = snap.view(NOW)
    decision = sched.plan(view)
    assert {x.program_id for x in decision.assignments} == {"a", "b"}
    first = decision.assignments[0].program_id
    st.apply(LLMEnd(ts=NOW + 0.5, program_id=first, request_id="r", prompt_tokens=3_000, completion_tokens=10))
    applied = sched.apply(decision, view)
    assert applied.assignments == () and sched.voided == 2
    assert first in applied.held and st.programs[first].home_worker is None


def test_apply_keeps_the_prefix_that_still_fits_live_memory():
    programs = [program(p, tokens=3_000, phase=Phase.REASONING) for p in ("a", "b")]
    st = state([("w0", 8_000, 0)], programs)
    sched = Scheduler(st, "maitred")
    view = st.snapshot().view(NOW)
    decision = sched.plan(view)
    assert len(decision.assignments) == 2
    intruder = program("c", tokens=3_000, home="w0", tier=Tier.GPU)
    st.programs["c"] = intruder  # a forced admission took room meanwhile
    applied = sched.apply(decision, view)
    assert len(applied.assignments) == 1 and applied.assignments == decision.assignments[:1]


def test_a_policy_without_admission_control_is_not_held_to_a_budget_it_never_had():
    programs = [program(p, tokens=6_000, phase=Phase.REASONING) for p in ("a", "b", "c")]
    st = state([("w0", 8_000, 0)], programs)
    sched = Scheduler(st, "round_robin")
    view = st.snapshot().view(NOW)
    applied = sched.apply(sched.plan(view), view)
    assert len(applied.assignments) == 3 and applied.admitted == {"a", "b", "c"}


def test_apply_drops_tier_moves_of_programs_that_moved():
    p = program("a", tokens=1_000, home="w0", tier=Tier.GPU)
    st = state([("w0", 10_000, 0), ("w1", 10_000, 0)], [p])
    decision = Decision("x", tier_moves=(TierMove("a", "w0", Tier.GPU, Tier.CPU),))
    view = st.snapshot().view(NOW)
    st.set_worker_health("w0", False)
    applied = Scheduler(st, "maitred").apply(decision, view)
    assert applied.tier_moves == () and st.programs["a"].tier is Tier.WAITING


def test_arrival_takes_a_gpu_program_and_maitred_promotes_one_that_fits_at_home():
    """A GPU-tier program goes at once under every policy; a demoted one goes back to its home
    GPU at once only under maitred (the baselines wait for their step, as published)."""

    def case(policy):
        gpu = program("g", tokens=2_000, home="w0", tier=Tier.GPU)
        cpu = program("c", tokens=2_000, home="w0", tier=Tier.CPU)
        big = program("b", tokens=9_000, home="w0", tier=Tier.CPU)
        st = state([("w0", 8_000, 20_000)], [gpu, cpu, big])
        return st, RuntimeCore(st, policy)

    st, core = case("maitred")
    assert core.arrive("g", NOW).worker == "w0"
    assert core.arrive("c", NOW).worker == "w0" and st.programs["c"].tier is Tier.GPU
    assert core.arrive("b", NOW).worker is None and st.programs["b"].tier is Tier.CPU and "b" in core.held
    st.set_worker_health("w0", False)
    assert core.arrive("g", NOW).worker is None
    for policy in ("thunderagent", "mori", "tao"):
        st, core = case(policy)
        assert core.arrive("g", NOW).worker == "w0"
        assert core.arrive("c", NOW).worker is None and st.programs["c"].tier is Tier.CPU, policy


def test_assignment_signature_is_what_apply_compares():
    p = program("a", tokens=1_000, phase=Phase.REASONING)
    st = state([("w0", 10_000, 0)], [p])
    view = st.snapshot().view(NOW)
    decision = Decision("x", assignments=(Assignment("a", "w0", "new", signature(view.programs["a"])),))
    applied = Scheduler(st, "maitred").apply(decision, view)
    assert applied.assignments == decision.assignments and st.programs["a"].home_worker == "w0"


def test_tool_events_that_arrive_after_the_next_step_began_still_count():
    """Events come batched while requests reach the gateway at once: the next llm.start can be
    seen before the tool events that preceded it."""
    st = state([("w0", 10_000, 0)], [])
    st.apply(LLMStart(ts=NOW, program_id="a", request_id="r1"))
    st.apply(LLMEnd(ts=NOW + 1, program_id="a", request_id="r1", prompt_tokens=100, completion_tokens=5))
    st.apply(ToolStart(ts=NOW + 2, program_id="a", call_id="c1", tool="pytest"))
    st.apply(LLMStart(ts=NOW + 5, program_id="a", request_id="r2"))  # its end is late
    st.apply(ToolEnd(ts=NOW + 4.5, program_id="a", call_id="c1"))
    st.apply(LLMEnd(ts=NOW + 6, program_id="a", request_id="r2", prompt_tokens=200, completion_tokens=5))
    st.apply(LLMStart(ts=NOW + 9, program_id="a", request_id="r3"))  # both events late
    st.apply(ToolStart(ts=NOW + 7, program_id="a", call_id="c2", tool="pytest"))
    assert st.programs["a"].phase is Phase.REASONING and st.programs["a"].tool is None, "a late start opens nothing"
    assert st.tool_for("a", "c2") is not None
    st.apply(ToolEnd(ts=NOW + 8, program_id="a", call_id="c2"))
    assert st.history.by_tool["pytest"].n == 2 and st.history.by_tool["pytest"].mean == 1.75
    assert st.predictions.n == 2 and st.tool_for("a", "c2") is None
