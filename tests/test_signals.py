"""Readiness (TAO), idleness (MORI), cache credit and pre-prefill priority, rule by rule."""

import math

import numpy as np
import pytest

from maitred.events import AdapterPublish, LLMEnd, LLMStart, ToolEnd, ToolProgress, ToolStart
from maitred.runtime import Phase, RuntimeState, SignalConfig, WorkerState
from maitred.runtime.history import DurationStats, ToolHistory, t_quantile
from maitred.runtime.records import OpenTool
from maitred.runtime.signals import cache_credit, decayed, idleness, predict_end, preprefill_priority, readiness
from maitred.storage import ToolStats
from tests.runtime_helpers import NOW, program

CFG = SignalConfig()


def history_of(tool: str, durations, signature: str | None = None) -> ToolHistory:
    h = ToolHistory()
    for d in durations:
        h.record(tool, signature, d)
    return h


def acting(tool: OpenTool):
    p = program("p")
    p.tool = tool
    return p


def test_t_quantile_is_close_to_the_exact_student_t():
    exact = {4: 1.5332, 9: 1.3830, 30: 1.3104}  # one-sided 90% quantiles
    for dof, value in exact.items():
        assert t_quantile(0.9, dof) == pytest.approx(value, rel=0.01)


def test_conservative_estimate_is_mean_plus_margin_clipped_to_observed_range():
    d = np.array([1.0, 1.2, 0.8, 1.1, 0.9, 1.0])
    stats = DurationStats()
    for x in d:
        stats.add(x)
    margin = t_quantile(0.9, 5) * d.std(ddof=1) / math.sqrt(6)
    assert stats.upper_estimate(0.9) == pytest.approx(d.mean() + margin)
    wide = DurationStats()
    for x in [1.0] * 5 + [100.0]:
        wide.add(x)
    assert wide.upper_estimate(0.9) <= 100.0  # never past the longest call seen


def test_explicit_eta_comes_first():
    h = history_of("pytest", [30.0] * 10)
    tool = OpenTool("c", "pytest", None, NOW - 5, eta_s=0.5, eta_at=NOW - 0.1)
    end, source, _ = predict_end(tool, h, NOW, CFG)
    assert (end, source) == (pytest.approx(NOW + 0.4), "eta")
    assert readiness(acting(tool), h, NOW, CFG).r == 1


def test_signature_history_then_tool_then_global_then_default():
    h = history_of("Bash", [0.05] * 5, signature="Bash:ls")
    for _ in range(5):
        h.record("Bash", "Bash:pytest", 40.0)
    ls = OpenTool("c1", "Bash", "Bash:ls", NOW)
    assert predict_end(ls, h, NOW, CFG)[1] == "signature"
    assert predict_end(ls, h, NOW, CFG)[0] == pytest.approx(NOW + 0.05)
    new_sig = OpenTool("c2", "Bash", "Bash:make", NOW)
    assert predict_end(new_sig, h, NOW, CFG)[1] == "tool"  # Bash overall has 10 calls
    assert predict_end(ls, h, NOW, CFG, use_signature=False)[1] == "tool"
    other = OpenTool("c3", "grep", None, NOW)
    assert predict_end(other, h, NOW, CFG)[1] == "global"
    empty = OpenTool("c4", "grep", None, NOW)
    end, source, _ = predict_end(empty, ToolHistory(), NOW, CFG)
    assert (end, source) == (NOW + 5.0, "default")


def test_too_little_tool_history_falls_back_to_global():
    h = history_of("grep", [0.1] * 4)
    h.record("pytest", None, 20.0)
    assert predict_end(OpenTool("c", "grep", None, NOW), h, NOW, CFG)[1] == "global"


def test_declared_deadline_caps_the_prediction():
    h = history_of("pytest", [60.0] * 10)
    tool = OpenTool("c", "pytest", None, NOW - 9.5, deadline_s=10.0)
    end, _, _ = predict_end(tool, h, NOW, CFG)
    assert end == NOW + 0.5
    assert readiness(acting(tool), h, NOW, CFG).r == 1


def test_ready_within_the_horizon_and_not_before():
    h = history_of("build", [3.0] * 10)
    tool = OpenTool("c", "build", None, NOW)
    assert readiness(acting(tool), h, NOW + 1.9, CFG).r == 0
    assert readiness(acting(tool), h, NOW + 2.0, CFG).r == 1


def test_probe_for_one_period_then_repredict_from_longer_history():
    """Calls of 'fetch' take 1 s or 10 s. Predicted ~ the mean bound; once that and its one-period
    probe pass without completion, the prediction moves to the calls longer than the elapsed
    time (the 10 s ones), and r drops to 0 until that comes near."""
    h = history_of("fetch", [1.0] * 8 + [10.0] * 2)
    tool = OpenTool("c", "fetch", None, NOW)
    first, _, _ = predict_end(tool, h, NOW, CFG)
    assert NOW + 1 < first < NOW + 10
    probe = readiness(acting(tool), h, first + 0.5, CFG)
    assert (probe.r, probe.probing) == (1, True)
    after = readiness(acting(tool), h, first + CFG.period_s + 0.1, CFG)
    assert after.r == 0 and after.predicted_end == pytest.approx(NOW + 10.0)
    assert readiness(acting(tool), h, NOW + 9.2, CFG).r == 1


def test_reprediction_doubles_when_no_longer_call_is_known():
    h = history_of("fetch", [1.0] * 10)
    tool = OpenTool("c", "fetch", None, NOW)
    r = readiness(acting(tool), h, NOW + 2.5, CFG)  # predicted 1.0, probed until 2.0
    assert r.r == 0 and r.predicted_end == pytest.approx(NOW + 4.0)  # 2 × (1.0 + 1 s probe)


def test_stale_eta_gives_zero():
    tool = OpenTool("c", "deploy", None, NOW - 100, eta_s=200.0, eta_at=NOW - 31)
    assert readiness(acting(tool), ToolHistory(), NOW, CFG).source == "stale"
    assert readiness(acting(tool), ToolHistory(), NOW, CFG).r == 0


def test_observed_completion_reasoning_and_human_wait():
    returned = program("a", returned=True)
    assert readiness(returned, ToolHistory(), NOW, CFG).r == 1
    assert readiness(program("b", phase=Phase.REASONING), ToolHistory(), NOW, CFG).r == 1
    assert readiness(program("c", phase=Phase.WAITING_HUMAN, tool=None), ToolHistory(), NOW, CFG).r == 0


def test_prediction_errors_are_recorded_when_tools_end():
    """Each call reports an ETA of 1 s at t+1 (predicted end t+2); they end at t+2.0, 2.3, 2.9."""
    st = RuntimeState([WorkerState("w", 10_000)])
    st.seed_history([ToolStats("lint", 10, 2.0, 0.0, 2.0, 2.0, 2.0, 2.0, 2.0)])
    t = NOW
    for i, actual in enumerate([2.0, 2.3, 2.9]):
        st.apply(ToolStart(ts=t, program_id="p", call_id=f"c{i}", tool="lint"))
        st.apply(ToolProgress(ts=t + 1, program_id="p", call_id=f"c{i}", eta_s=1.0))
        st.apply(ToolEnd(ts=t + actual, program_id="p", call_id=f"c{i}"))
        t += 10
    assert st.predictions.n == 3
    assert st.predictions.mae_s == pytest.approx((0.0 + 0.3 + 0.9) / 3)
    assert st.predictions.within_half_second_share == pytest.approx(2 / 3)
    assert st.history.by_tool["lint"].n == 13


def test_idleness_is_the_acting_share_of_the_last_k_cycles_including_the_open_one():
    p = program("p", phase=Phase.ACTING, cycles=[(100.0, 0.0), (1.0, 1.0), (1.0, 3.0), (2.0, 2.0), (1.0, 1.0)])
    p.phase_since = NOW - 2.0  # open cycle: 2 s of acting so far
    # K=5: the open cycle plus the last four completed ones; the (100, 0) cycle is too old
    assert idleness(p, NOW, 5) == pytest.approx((1 + 3 + 2 + 1 + 2) / (2 + 4 + 4 + 2 + 2))
    assert idleness(program("new", phase=Phase.REASONING), NOW, 5) == 0.0


def test_time_held_in_the_gateway_counts_as_reasoning():
    st = RuntimeState([WorkerState("w", 10_000)])
    st.apply(ToolStart(ts=NOW, program_id="p", call_id="c", tool="bash"))
    st.apply(ToolEnd(ts=NOW + 4, program_id="p", call_id="c"))
    st.request_arrived("p", NOW + 5)
    assert idleness(st.programs["p"], NOW + 15, 5) == pytest.approx(5 / 15)


def test_cache_credit_halves_every_half_life_and_dies_with_an_adapter_publish():
    assert decayed(8000, 10.0, 10.0) == 4000
    assert decayed(8000, 0.0, 10.0) == 8000
    st = RuntimeState([WorkerState("w0", 100_000)])
    st.request_arrived("p", NOW, model="m", adapter="lora", prompt_tokens=5000)
    st.apply(LLMEnd(ts=NOW + 1, program_id="p", request_id="r", prompt_tokens=5000, completion_tokens=100, worker="w0"))
    p = st.programs["p"]
    assert cache_credit(p, "w0", NOW + 21, 10.0, st.adapter_versions) == round(5100 * 0.25)
    assert cache_credit(p, "w1", NOW + 1, 10.0, st.adapter_versions) == 0
    st.apply(AdapterPublish(ts=NOW + 2, program_id="p", adapter="lora", version="2"))
    assert cache_credit(p, "w0", NOW + 2, 10.0, st.adapter_versions) == 0


def test_preprefill_priority_follows_local():
    """Π = ρ(1 + β ln(1+s)) · min(Δ, M)/M · H · Δ: 4096 missing tokens, 2 consumers, ρ = 1:
    D = (1 + 0.5 ln 3) · 0.5 = 0.77465, Π = 0.77465 · 4096 = 3172.98."""
    assert preprefill_priority(4096, consumers=2, confidence=1.0, heat=1.0, cfg=CFG) == pytest.approx(3172.98, abs=0.01)
    assert preprefill_priority(0, consumers=5, confidence=1.0, heat=1.0, cfg=CFG) == 0.0
    capped = preprefill_priority(16384, consumers=1, confidence=1.0, heat=1.0, cfg=CFG)
    assert capped == pytest.approx((1 + 0.5 * math.log(2)) * 16384)


def test_progress_events_feed_the_eta():
    st = RuntimeState([WorkerState("w", 10_000)])
    st.apply(ToolStart(ts=NOW, program_id="p", call_id="c", tool="deploy"))
    st.apply(ToolProgress(ts=NOW + 2, program_id="p", call_id="c", fraction=0.9, eta_s=0.5))
    r = readiness(st.programs["p"], st.history, NOW + 2.1, st.cfg)
    assert (r.r, r.source, r.predicted_end) == (1, "eta", pytest.approx(NOW + 2.5))


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="horizon_s"):
        SignalConfig(horizon_s=0)


def test_llm_events_move_phase_and_context():
    st = RuntimeState([WorkerState("w", 10_000)])
    st.apply(LLMStart(ts=NOW, program_id="p", request_id="r", prompt_tokens=900))
    assert st.programs["p"].phase is Phase.REASONING
    st.apply(LLMEnd(ts=NOW + 1, program_id="p", request_id="r", prompt_tokens=900, completion_tokens=50, worker="w"))
    p = st.programs["p"]
    assert (p.phase, p.context_tokens) == (Phase.ACTING, 950)
