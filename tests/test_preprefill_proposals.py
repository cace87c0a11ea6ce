"""What cross-agent pre-prefill needs outside its planner: the consumer agent's system prompt
learned from its first request, a step right after a handoff, and no demotion of a program that
has just handed off (its consumer asks as soon as the producer's tools end)."""

from maitred.events import Handoff
from maitred.runtime import Phase, Scheduler, SignalConfig, Tier
from maitred.runtime.preprefill import propose
from maitred.runtime.state import HANDOFF_TTL_S
from maitred.sim.profile import EngineProfile
from maitred.sim.replay import RunConfig, run_one
from maitred.sim.traces import ProgramTrace, Step, ToolCall, Trace
from tests.runtime_helpers import NOW, program, state

TIGHT = SignalConfig(overcommit_headroom=0.0)


def test_an_agent_first_seen_as_a_consumer_is_learned_from_its_first_prompt():
    """coder only ever starts from a handoff: its first prompt (10,000) less the shared context
    (3,000) is its system prompt, so the next handoff to it warms 7,000 + 2,000 tokens."""
    st_ = state([("w0", 100_000, 0)], [])
    st_.request_arrived("p", NOW - 10, agent="planner", prompt_tokens=8_000)
    st_.apply(Handoff(ts=NOW - 5, program_id="p", agent="planner", from_agent="planner", to_agent="coder", context_tokens=3_000))
    st_.request_arrived("p", NOW - 4, agent="coder", prompt_tokens=10_000)
    assert st_.agent_prefix_tokens["coder"] == 7_000
    st_.programs["q"] = program("q", tokens=8_000, home="w0", tier=Tier.GPU, agent="planner")
    st_.apply(Handoff(ts=NOW, program_id="q", agent="planner", from_agent="planner", to_agent="coder", context_tokens=2_000))
    view = st_.view(NOW)
    assert [(w.program_id, w.tokens) for w in propose(view, ()) if w.kind == "handoff"] == [("q", 9_000)]


def test_a_program_that_just_handed_off_is_demoted_last():
    """Two acting programs over a 10,000-token tier; a is the more idle, but it has just handed
    off to a coder (its consumer asks when its tools end): b goes to host memory instead."""
    a = program("a", tokens=5_488, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 3)
    b = program("b", tokens=5_488, home="w0", tier=Tier.GPU, cycles=[(5, 5)] * 3)
    for p in (a, b):
        p.phase_since = NOW
    st_ = state([("w0", 10_000, 10_000)], [a, b], TIGHT)
    st_.apply(Handoff(ts=NOW, program_id="a", agent="planner", from_agent="planner", to_agent="coder", context_tokens=1_000))
    decision = Scheduler(st_, "maitred").tick(NOW)
    assert [(m.program_id, m.dst) for m in decision.tier_moves] == [("b", Tier.CPU)]
    assert b.phase is Phase.ACTING


def test_a_handoff_before_a_short_tool_is_still_warmed():
    """The planner's last tool takes 0.4 s, less than any scheduling period: only a step right
    after the handoff proposes the warmup before the coder asks."""
    tool, short = (ToolCall("Bash", 12.0),), (ToolCall("Read", 0.4),)
    teacher = ProgramTrace("coder-first", (Step("coder", 8_000, 50, tool), Step("coder", 8_500, 50)))
    handoffs = [
        ProgramTrace(
            f"handoff-{i}",
            (
                Step("planner", 7_000, 50, tool),
                Step("planner", 8_000, 50, short),
                Step("coder", 10_000, 50, tool, handoff_tokens=10_000),
                Step("coder", 10_600, 50),
            ),
        )
        for i in range(6)
    ]
    trace = Trace("short-handoffs", [teacher, *handoffs], {"planner": 6_000, "coder": 7_000})
    on, off = (run_one(trace, RunConfig(p, 2, duration_s=600), EngineProfile()) for p in ("maitred", "maitred_no_preprefill"))
    assert on.handoff_ttft_mean_s is not None and off.handoff_ttft_mean_s is not None
    assert on.handoff_ttft_mean_s <= 0.6 * off.handoff_ttft_mean_s, (on.handoff_ttft_mean_s, off.handoff_ttft_mean_s)


def test_a_request_that_names_no_agent_is_the_consumers_and_stale_handoffs_expire():
    """The gateway's requests carry no agent name: after a handoff, the program's next request is
    its consumer's and the handoff is done. A handoff whose consumer never asks leaves every view
    after HANDOFF_TTL_S, so it neither shields its program from demotion nor asks for warmups."""
    st_ = state([("w0", 100_000, 0)], [])
    st_.request_arrived("p", NOW - 10, agent="planner", prompt_tokens=8_000)
    st_.apply(Handoff(ts=NOW - 5, program_id="p", agent="planner", from_agent="planner", to_agent="coder", context_tokens=3_000))
    assert [h.program_id for h in st_.view(NOW).handoffs] == ["p"]
    st_.request_arrived("p", NOW - 4, prompt_tokens=9_000)
    assert st_.view(NOW).handoffs == ()
    st_.apply(
        Handoff(
            ts=NOW - HANDOFF_TTL_S - 1,
            program_id="q",
            agent="planner",
            from_agent="planner",
            to_agent="coder",
            context_tokens=1_000,
        )
    )
    assert st_.handoffs and st_.view(NOW).handoffs == () and st_.snapshot().view(NOW).handoffs == ()
