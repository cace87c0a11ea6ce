"""The programs as ``GET /v1/programs`` shows them (``LiveDriver`` part).

What the driver knows of each program, read out for people and dashboards: its phase, tier,
worker, signals, priorities and what is cached where. Nothing here changes the state.
"""

from collections.abc import Callable, Container, Iterable
from typing import Any

from maitred.runtime.core import RuntimeCore
from maitred.runtime.records import Tier
from maitred.runtime.state import RuntimeState


class ProgramView:
    """``describe`` and the priority ratchet it shows (a mixin of ``LiveDriver``)."""

    state: RuntimeState
    core: RuntimeCore
    clock: Callable[[], float]
    last_usage: dict[str, tuple[int, int | None]]
    _held: Container[str]

    @property
    def ratchet(self) -> dict[str, dict[str, int]]:
        return self.core.ratchet

    def describe(self, program_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Programs as ``GET /v1/programs`` shows them (SPEC 7.5 fields, and a few more)."""
        now = self.clock()
        state = self.state
        ids = list(state.programs) if program_ids is None else [pid for pid in program_ids if pid in state.programs]
        out = []
        for pid in ids:
            p = state.programs[pid]
            signals = state.signals_of(p, now)
            last_prompt, last_cached = self.last_usage.get(pid, (None, None))
            out.append(
                {
                    "program_id": pid,
                    "agent": p.agent,
                    "phase": p.phase.value,
                    "tier": p.tier.value,
                    "worker": p.home_worker,
                    "context_tokens": p.context_tokens,
                    "idleness": round(signals.idleness, 4),
                    "readiness": signals.readiness.r,
                    "readiness_source": signals.readiness.source,
                    "predicted_tool_end": signals.readiness.predicted_end,
                    "tool": None
                    if p.tool is None
                    else {
                        "call_id": p.tool.call_id,
                        "tool": p.tool.tool,
                        "signature": p.tool.signature,
                        "started": p.tool.started,
                    },
                    "held": pid in self._held,
                    "last_prompt_tokens": last_prompt,
                    "last_cached_tokens": last_cached,
                    "priority": None if p.home_worker is None else self.ratchet.get(pid, {}).get(p.home_worker),
                    "cached": {k[0]: {"tokens": r.tokens, "observed_at": r.observed_at} for k, r in p.residency.items()},
                    "gpu_tier": p.tier is Tier.GPU,
                }
            )
        return out
