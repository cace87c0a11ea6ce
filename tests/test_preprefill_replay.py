"""Cross-agent pre-prefill in the replay: the consumer's first-request TTFT is measured, and
warming the consumer's prompt while the producer's tools run lowers it (LOCAL's claim)."""

import math

import pytest

from maitred.sim.profile import EngineProfile
from maitred.sim.replay import SIM_POLICIES, Replay, RunConfig, SimPolicy, run_one
from maitred.sim.traces import ProgramTrace, Step, ToolCall, Trace, load_trace

PREFIX = {"planner": 6_000, "coder": 7_000}


def handoff_trace(programs: int = 6) -> Trace:
    """Planners that hand over to a coder after two steps, each step followed by a 12 s tool
    (longer than maitred's scheduling period, so a step sees the handoff before the consumer asks).
    One program starts as a coder, so the runtime learns the coder's system prompt the way the
    gateway does: from an agent's first prompt."""
    tool = (ToolCall("Bash", 12.0),)
    teacher = ProgramTrace("coder-first", (Step("coder", 8_000, 50, tool), Step("coder", 8_500, 50)))
    shared = 3_000
    handoffs = [ProgramTrace(f"handoff-{i}", (
        Step("planner", 7_000, 50, tool),
        Step("planner", 8_000, 50, tool),
        Step("coder", PREFIX["coder"] + shared, 50, tool, handoff_tokens=PREFIX["coder"] + shared),
        Step("coder", PREFIX["coder"] + shared + 600, 50),
    )) for i in range(programs)]
    return Trace("handoffs", [teacher, *handoffs], dict(PREFIX))


def run(trace: Trace, policy: str, **kw: object):
    return run_one(trace, RunConfig(policy, concurrency=2, duration_s=600, seed=0, **kw), EngineProfile())  # type: ignore[arg-type]


def test_the_replay_records_each_handoff_consumers_first_request():
    trace = handoff_trace()
    result = run(trace, "maitred_no_preprefill")
    assert result.handoff_requests > 10
    assert result.handoff_ttft_mean_s is not None and math.isfinite(result.handoff_ttft_mean_s) and result.handoff_ttft_mean_s > 0
    assert result.handoff_requests < result.requests  # only the first request of each consumer


def test_a_trace_without_handoffs_has_no_consumer_ttft():
    result = run_one(load_trace("synthetic:claude-code?programs=20&handoffs=0"), RunConfig("maitred", 4, duration_s=200))
    assert result.handoff_requests == 0 and result.handoff_ttft_mean_s is None


def test_preprefill_lowers_the_consumers_first_ttft_at_low_load():
    """The warmup computes the coder's prompt (its system prompt is cached; the shared messages
    are not) during the planner's last tool, so the consumer's first request hits it."""
    trace = handoff_trace()
    on, off = run(trace, "maitred"), run(trace, "maitred_no_preprefill")
    assert on.warmups > 0 and off.warmups == 0
    assert on.handoff_ttft_mean_s is not None and off.handoff_ttft_mean_s is not None
    assert on.handoff_ttft_mean_s <= 0.6 * off.handoff_ttft_mean_s, (on.handoff_ttft_mean_s, off.handoff_ttft_mean_s)
    assert on.throughput_tok_s >= 0.99 * off.throughput_tok_s  # warmups take no foreground work


def test_no_preprefill_is_maitred_with_its_warmups_off():
    sim = SIM_POLICIES["maitred_no_preprefill"]
    assert sim.runtime == "maitred" and not sim.preprefill
    replay = Replay(handoff_trace(), RunConfig("maitred_no_preprefill", 2), EngineProfile())
    assert replay.scheduler.policy.name == "maitred" and not replay.scheduler.policy.preprefill  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="preprefill: only the maitred runtime policy"):
        SimPolicy("mori", preprefill=False)
