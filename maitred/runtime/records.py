"""The plain data the policies read: programs, workers, and the knobs of the signals.

These are mutable records owned by ``RuntimeState`` (which alone writes them, from events and
applied decisions). Policies receive them read-only through a ``View`` and answer with a
``Decision``; the tests check that a policy step leaves the state untouched.
"""

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum


class Phase(StrEnum):
    """What the program is doing (not what the scheduler did to it)."""

    REASONING = "reasoning"  # a model call is running or queued: the program wants the GPU
    ACTING = "acting"  # between model calls: a tool runs, or the client is busy
    WAITING_HUMAN = "waiting_human"  # blocked on a person (Claude Code Stop ... UserPromptSubmit)


class Tier(StrEnum):
    """Where the scheduler keeps the program's KV on its home worker."""

    GPU = "gpu"
    CPU = "cpu"
    WAITING = "waiting"  # KV dropped (or never built): resuming costs a full prefill


CacheKey = tuple[str, str | None, str | None, str | None]
"""(worker, model, adapter, adapter version): KV is only reusable under the same key (LOCAL)."""


@dataclass(slots=True)
class OpenTool:
    call_id: str
    tool: str
    signature: str | None
    started: float
    deadline_s: float | None = None
    eta_s: float | None = None  # seconds left, as of ``eta_at`` (tool.progress)
    eta_at: float | None = None
    ended_at: float | None = None  # completion observed


@dataclass(slots=True)
class Residency:
    tokens: int
    observed_at: float


@dataclass(slots=True)
class ProgramState:
    program_id: str
    agent: str | None = None
    parent_program_id: str | None = None
    phase: Phase = Phase.REASONING
    phase_since: float = 0.0
    tool: OpenTool | None = None
    returned: bool = False  # a tool (or a human) finished; the next request is imminent
    # Stopped on its own background work (``program.wait`` reason ``background``): acting, as
    # waiting on a child counts, until the work reports back. Cleared by the next phase change.
    awaiting_background: bool = False
    context_tokens: int = 0
    #: the program's first prompt (mostly its agent's system prompt), kept until its agent is known
    first_prompt_tokens: int | None = None
    model: str | None = None
    adapter: str | None = None
    adapter_version: str | None = None
    home_worker: str | None = None
    tier: Tier = Tier.WAITING
    lazy_demote: bool = False
    lazy_since: float = 0.0  # the start of the step a lazy demotion waits for (ThunderAgent's mark)
    residency: dict[CacheKey, Residency] = field(default_factory=dict)
    # Idleness history: completed (reasoning_s, acting_s) cycles, newest last, plus the open cycle.
    cycles: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=16))
    open_reason_s: float = 0.0
    open_act_s: float = 0.0

    def weight(self, reserve_tokens: int) -> int:
        """KV demand used for admission: context plus a reserve for the next step's growth."""
        return self.context_tokens + reserve_tokens


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    gpu_tokens: int
    cpu_tokens: int = 0
    write_back: bool = False  # HiCache ``--hicache-write-policy write_back``: host memory adds to the GPU's
    healthy: bool = True
    queued_requests: int = 0  # foreground requests waiting in the engine (SGLang /v1/loads)
    used_tokens: int | None = None  # engine-reported KV use, when known
    warmups_in_flight: int = 0


@dataclass(slots=True)
class Prompts:
    """Which prompts the driver holds, so a warmup can be sent: a program's last prompt, a
    handoff consumer's announced prompt, and which programs have a warmup in flight (one at a
    time). The core keeps it from what the driver tells it; the policy's warmup admission reads
    it, so a warmup that cannot be sent takes no slot of one that can."""

    last: set[str] = field(default_factory=set)
    handoff: set[str] = field(default_factory=set)
    warming: set[str] = field(default_factory=set)

    def sendable(self, program_id: str, kind: str) -> bool:
        return program_id in (self.handoff if kind == "handoff" else self.last) and program_id not in self.warming

    def forget(self, program_id: str) -> None:
        self.last.discard(program_id)
        self.handoff.discard(program_id)
        self.warming.discard(program_id)

    def copy(self) -> "Prompts":
        return Prompts(set(self.last), set(self.handoff), set(self.warming))


@dataclass(slots=True)
class PendingHandoff:
    """A handoff whose consumer has not made its first request yet (a pre-prefill opportunity)."""

    program_id: str  # where the consumer runs (the child program, or the same one)
    to_agent: str
    context_tokens: int
    ts: float
    expected_prompt_tokens: int | None = None
    consumers: int = 1


@dataclass(frozen=True, slots=True)
class SignalConfig:
    """Every parameter of the signals and policies, with the papers' defaults."""

    idleness_cycles: int = 5  # MORI: K reason/act cycles, including the open one
    horizon_s: float = 1.0  # TAO: r = 1 when the predicted return is within H
    period_s: float = 1.0  # scheduling period (also the probe length)
    default_tool_s: float = 5.0  # TAO: no history at all
    min_history: int = 5  # TAO: per-tool history needs n >= 5
    stale_after_s: float = 30.0  # TAO: an ETA not refreshed for this long gives r = 0
    confidence: float = 0.9  # one-sided level of the finite-sample upper bound
    credit_half_life_s: float = 10.0  # TAO: cache credit half-life
    reserve_tokens: int = 512  # TAO: admission reserve per program
    dp_quanta: int = 64  # capacity quanta per worker in the DP
    dp_state_budget: int = 20_000  # DP states (all layers) before falling back to BFD
    warmup_reserve_tokens: int = 4096  # free KV a worker must keep beyond a warmup
    max_warmups_in_flight: int = 2  # per worker
    preprefill_beta: float = 0.5  # LOCAL: consumer-count weight
    preprefill_cap_tokens: int = 8192  # LOCAL: M, the cap on missing tokens in D
    busy_margin: float = 0.9  # maitred: share of GPU KV the expected busy set may fill
    overcommit_headroom: float = 0.4  # maitred: admitted KV beyond what GPU and host can keep, × GPU

    def __post_init__(self) -> None:
        for name in ("idleness_cycles", "min_history", "dp_quanta", "dp_state_budget"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("horizon_s", "period_s", "default_tool_s", "stale_after_s", "credit_half_life_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0.5 <= self.confidence < 1:
            raise ValueError("confidence must be in [0.5, 1)")
        if not 0 < self.busy_margin <= 1:
            raise ValueError("busy_margin must be in (0, 1]")
        if not (math.isfinite(self.overcommit_headroom) and self.overcommit_headroom >= 0):
            raise ValueError("overcommit_headroom must be a finite number >= 0")
