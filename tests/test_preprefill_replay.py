"""Cross-agent pre-prefill in the replay: the consumer's first-request TTFT is measured, and
warming the consumer's prompt while the producer's tools run lowers it (LOCAL's claim)."""

import math

import pytest

from maitred.runtime import Tier
from maitred.runtime.decisions import Warmup
from maitred.runtime.preprefill import choose_warmups, room_needed
from maitred.sim.profile import EngineProfile
from maitred.sim.replay import SIM_POLICIES, Replay, RunConfig, SimPolicy, run_one
from maitred.sim.traces import ProgramTrace, Step, ToolCall, Trace, load_trace
from tests.runtime_helpers import NOW, program, state

PREFIX = {"planner": 6_000, "coder": 7_000}


def handoff_trace(programs: int = 6) -> Trace:
    """Planners that hand over to a coder after two steps, each step followed by a 12 s tool
    (longer than maitred's scheduling period, so a step sees the handoff before the consumer asks).
    One program starts as a coder, so the runtime learns the coder's system prompt the way the
    gateway does: from an agent's first prompt."""
    tool = (ToolCall("Bash", 12.0),)
    teacher = ProgramTrace("coder-first", (Step("coder", 8_000, 50, tool), Step("coder", 8_500, 50)))
    shared = 3_000
    handoffs = [
        ProgramTrace(
            f"handoff-{i}",
            (
                Step("planner", 7_000, 50, tool),
                Step("planner", 8_000, 50, tool),
                Step("coder", PREFIX["coder"] + shared, 50, tool, handoff_tokens=PREFIX["coder"] + shared),
                Step("coder", PREFIX["coder"] + shared + 600, 50),
            ),
        )
        for i in range(programs)
    ]
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


# -- the planner: room a warmup takes, and admission under load -----------------------------------


def handoff_warmup(pid: str, tokens: int, *, worker: str = "w0", kind: str = "handoff", priority: float = 1.0) -> Warmup:
    return Warmup(pid, worker, tokens, kind, priority, "coder")


def test_a_handoff_consumer_in_the_gpu_tier_needs_only_the_room_beyond_its_own():
    """The consumer's prompt (another agent's prefix) replaces the producer's context, for which
    the plan already holds room (context + the 512-token reserve) on its home worker."""
    view = state(
        [("w0", 100_000, 100_000), ("w1", 100_000, 100_000)],
        [
            program("home", tokens=20_000, home="w0", tier=Tier.GPU),
            program("away", tokens=20_000, home="w0", tier=Tier.CPU),
        ],
    ).view(NOW)
    assert room_needed(view, handoff_warmup("home", 12_000)) == 0
    assert room_needed(view, handoff_warmup("home", 30_000)) == 30_000 - 20_512
    assert room_needed(view, handoff_warmup("away", 12_000)) == 12_000  # holds no GPU room
    assert room_needed(view, handoff_warmup("home", 12_000, worker="w1")) == 12_000  # not its home
    assert room_needed(view, handoff_warmup("home", 12_000, kind="recompute")) == 12_000  # same prompt grows


def test_under_load_only_warmups_that_need_no_new_room_are_admitted():
    """With foreground requests queued and no free KV (C=80), a consumer that fits in its own
    room is still warmed (the engine runs foreground prefill first, and it takes no memory a
    queued request waits for); one that needs more waits, as before."""
    st_ = state(
        [("w0", 100_000, 100_000)],
        [
            program("fits", tokens=20_000, home="w0", tier=Tier.GPU),
            program("grows", tokens=20_000, home="w0", tier=Tier.GPU),
        ],
    )
    fits, grows = handoff_warmup("fits", 12_000, priority=2.0), handoff_warmup("grows", 30_000)
    st_.prompts.handoff |= {"fits", "grows"}  # the driver holds both consumers' prompts
    st_.workers["w0"].queued_requests = 2
    assert choose_warmups(st_.view(NOW), [fits, grows], {"w0": 50_000}) == (fits,)
    st_.workers["w0"].queued_requests = 0
    assert choose_warmups(st_.view(NOW), [fits, grows], {"w0": 0}) == (fits,)
    assert choose_warmups(st_.view(NOW), [fits, grows], {"w0": 50_000}) == (fits, grows)
    st_.workers["w0"].warmups_in_flight = 2  # the cap in flight still holds
    assert choose_warmups(st_.view(NOW), [fits, grows], {"w0": 50_000}) == ()
