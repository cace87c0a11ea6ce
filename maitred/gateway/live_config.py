"""The live driver's settings (``maitred serve`` flags), apart from the driver that uses them."""

import math
from dataclasses import dataclass, field

from maitred.gateway.prompt_keep import PromptLimits
from maitred.runtime.records import SignalConfig

#: A program that sends no news for this long, and no ``program.end``, is forgotten by the
#: gateway (``maitred serve --program-ttl``); the store keeps it.
PROGRAM_TTL_S = 3600.0
#: ``maitred serve --lease-poll``'s default: how often a standby tries its shard's lease and a
#: holder checks it (``maitred.gateway.standby``).
LEASE_POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class LiveConfig:
    policy: str = "maitred"
    tick_s: float | None = None  # periodic scheduler step (None: the policy's cadence)
    min_gap_s: float = 0.01  # event-driven steps closer than this are coalesced
    hold_timeout_s: float | None = None  # bounded wait of a held request (None: the policy's cadence)
    poll_s: float = 1.0  # worker health and load polling
    fail_after: int = 3  # failed health checks in a row before a worker is declared down
    priority: bool = False  # set SGLang's request priority (--radix-eviction-policy priority)
    priority_epoch_s: float = 10.0  # see maitred.runtime.admission.encode_priority
    warmups: bool = True
    journal: bool = False  # keep the core's decisions for GET /v1/journal
    program_ttl_s: float = PROGRAM_TTL_S  # programs silent this long are forgotten (no program.end came)
    busy_margin: float = SignalConfig().busy_margin  # maitred's GPU-tier sizing (tiering.py)
    overcommit_headroom: float = SignalConfig().overcommit_headroom
    prompts: PromptLimits = field(default_factory=PromptLimits)  # what is kept of prompts for warmups
    #: re-sent events recognised among the last this many ingested (``recent_keys.RecentKeys``; 0: off);
    #: about 150 bytes each, so the default costs some 15 MB at most
    recent_event_keys: int = 100_000

    def __post_init__(self) -> None:
        for name in ("tick_s", "hold_timeout_s", "poll_s", "priority_epoch_s", "program_ttl_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.recent_event_keys < 0:
            raise ValueError(f"recent_event_keys must be >= 0, got {self.recent_event_keys!r}")
        if self.fail_after < 1:
            raise ValueError("fail_after must be at least 1")
