"""The per-program signals every policy ranks on: idleness (MORI), readiness (TAO), cache credit
(TAO, version-aware as in LOCAL) and pre-prefill priority (LOCAL).

Pure functions of plain data and an explicit ``now``; nothing here reads a clock or mutates.
"""

import math
from dataclasses import dataclass
from itertools import islice

from maitred.runtime.history import ToolHistory
from maitred.runtime.records import OpenTool, Phase, ProgramState, SignalConfig

#: ``Phase.REASONING``, read once: an enum member read off its class is slow on Python 3.11, and
#: ``idleness`` runs for every program at every step.
_REASONING = Phase.REASONING


def idleness(p: ProgramState, now: float, cycles: int) -> float:
    """Share of the last ``cycles`` reason/act cycles (the open one included) spent acting.

    Ranked, never compared with a threshold; maitred also sums ``1 − ι`` over programs as the
    expected busy share (``tiering.working_set_capacity``). No history yet: 0 (treated as busy).
    A snapshot's view computes the same, for all programs at once, in ``idleness_table``: a
    change here goes there too (``tests/test_idleness_table.py`` holds the two equal).
    """
    reason, act = p.open_reason_s, p.open_act_s
    open_for = max(now - p.phase_since, 0.0)
    if p.phase is _REASONING:
        reason += open_for
    else:
        act += open_for
    for r, a in islice(reversed(p.cycles), cycles - 1):  # newest first; every program, every step
        reason += r
        act += a
    total = reason + act
    return act / total if total > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Readiness:
    r: int  # 1: the program will want the GPU within the horizon
    predicted_end: float | None  # the tool's predicted end, when a tool is open
    source: str  # observed, reasoning, client, human, eta, signature, tool, global, default, stale, overdue
    probing: bool = False  # past the prediction without completion: the one-period probe


def predict_end(
    tool: OpenTool, history: ToolHistory, now: float, cfg: SignalConfig, *, use_signature: bool = True
) -> tuple[float | None, str, bool]:
    """Predicted end of an open tool call: (end, source, probing); end None once it is overdue.

    Order: a fresh explicit ETA, else history (signature, tool, global with n ≥ min_history),
    else the default. The estimate is capped by the declared deadline. Once the prediction and
    its one-period probe have passed without completion, it is re-predicted from the recorded
    durations longer than the elapsed time, or doubled when none are longer.
    """
    hit = history.lookup(tool.tool, tool.signature, cfg.min_history, use_signature=use_signature)
    if tool.eta_s is not None and tool.eta_at is not None:
        end, source = tool.eta_at + tool.eta_s, "eta"
    elif hit is not None:
        end, source = tool.started + hit.stats.upper_estimate(cfg.confidence), hit.source
    else:
        end, source = tool.started + cfg.default_tool_s, "default"
    cap = tool.started + tool.deadline_s if tool.deadline_s is not None else math.inf
    end = min(end, cap)
    while now >= end + cfg.period_s:
        elapsed = end - tool.started + cfg.period_s
        longer = hit.stats.longer_than(elapsed) if hit is not None else None
        repredicted = min(tool.started + (longer.upper_estimate(cfg.confidence) if longer else 2 * elapsed), cap)
        if repredicted <= end:
            return None, "overdue", False
        end = repredicted
    return end, source, now >= end


def readiness(p: ProgramState, history: ToolHistory, now: float, cfg: SignalConfig, *, use_signature: bool = True) -> Readiness:
    if p.returned:
        return Readiness(1, None, "observed")
    if p.phase is Phase.REASONING:
        return Readiness(1, None, "reasoning")
    if p.phase is Phase.WAITING_HUMAN:
        return Readiness(0, None, "human")
    if p.tool is None:
        return Readiness(1, None, "client")
    if p.tool.eta_at is not None and now - p.tool.eta_at > cfg.stale_after_s:
        return Readiness(0, None, "stale")
    end, source, probing = predict_end(p.tool, history, now, cfg, use_signature=use_signature)
    if end is None:
        return Readiness(0, None, source)
    return Readiness(1 if probing or end - now <= cfg.horizon_s else 0, end, source, probing)


def decayed(tokens: int, age_s: float, half_life_s: float) -> int:
    """TAO's cache credit: k = round(k0 · 2^(−τ/h))."""
    return round(tokens * 2.0 ** (-max(age_s, 0.0) / half_life_s))


def cache_credit(p: ProgramState, worker: str, now: float, half_life_s: float, adapter_versions: dict[str, str]) -> int:
    """Decayed credit of ``p``'s prefix on ``worker`` under its current model and adapter; KV
    computed under an adapter version older than the published one counts for nothing."""
    current = adapter_versions.get(p.adapter) if p.adapter else None
    best = 0
    for (w, model, adapter, version), seen in p.residency.items():
        if w != worker or model != p.model or adapter != p.adapter:
            continue
        if adapter is not None and current is not None and version != current:
            continue
        best = max(best, decayed(seen.tokens, now - seen.observed_at, half_life_s))
    return best


def preprefill_priority(missing_tokens: int, *, consumers: int, confidence: float, heat: float, cfg: SignalConfig) -> float:
    """LOCAL's Π = D · H · C with D = ρ (1 + β ln(1 + s)) · min(Δ, M)/M and C ∝ Δ."""
    if missing_tokens <= 0:
        return 0.0
    cap = cfg.preprefill_cap_tokens
    demand = confidence * (1 + cfg.preprefill_beta * math.log1p(consumers)) * min(missing_tokens, cap) / cap
    return demand * heat * missing_tokens
