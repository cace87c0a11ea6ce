"""One scheduling step's output, as data (the vLLM ``SchedulerOutput`` pattern).

The gateway and the simulator both apply a ``Decision``; neither asks the policy anything else.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from maitred.runtime.records import Tier

Signature = tuple[object, ...]
"""What a program looked like when planned; a plan step is void if it changed (TAO's re-check)."""


@dataclass(frozen=True, slots=True)
class TierMove:
    """Move ``program_id``'s KV on ``worker`` from ``src`` to ``dst``. ``lazy``: the program is
    mid-step, so the move happens when the step ends (MORI's lazy demotion)."""

    program_id: str
    worker: str
    src: Tier
    dst: Tier
    lazy: bool = False
    #: a lazy move's step, by its start as planned (ThunderAgent's mark: paused when *that*
    #: request ends, even if another began before the plan was applied); None: the live one
    since: float | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    """Run ``program_id`` on ``worker`` (its new home), admitted to the GPU tier."""

    program_id: str
    worker: str
    reason: str  # new, waiting, returning, failover
    signature: Signature


@dataclass(frozen=True, slots=True)
class Warmup:
    """Prefill ``tokens`` of ``program_id``'s next prompt on ``worker`` before it asks (``kind``:
    handoff, load_back, recompute); ``priority`` is LOCAL's Π."""

    program_id: str
    worker: str
    tokens: int
    kind: str
    priority: float
    agent: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    policy: str
    tier_moves: tuple[TierMove, ...] = ()
    assignments: tuple[Assignment, ...] = ()
    admitted: frozenset[str] = frozenset()  # programs whose requests may run now
    held: frozenset[str] = frozenset()  # programs that want the GPU but must wait
    #: GPU-tier programs whose next request waits for a step all the same (ThunderAgent's
    #: marked programs: paused when their running request ends)
    withheld: frozenset[str] = frozenset()
    warmups: tuple[Warmup, ...] = ()
    priorities: Mapping[str, int] = field(default_factory=dict)  # SGLang request priority (higher = keep)
    dp_fallback: bool | None = None  # placement fell back to BFD (None: no DP this step)
    tier_tokens: Mapping[str, int] = field(default_factory=dict)  # GPU-tier size planned per worker (default: its GPU)
