"""What a replay run is asked for and what it reports: the simulator's policies (each a runtime
policy plus the engine behaviour it runs on), a run's configuration and its result.

Plain data, apart from ``maitred.sim.replay`` which runs them, so that the bench matrix, the CLI
and the parity harness can name runs without importing the replay loop.
"""

from dataclasses import dataclass, replace
from typing import Any

from maitred.runtime.admission import Cadence
from maitred.runtime.core import CoreConfig
from maitred.runtime.policies import Maitred, Policy, make_policy
from maitred.runtime.policies.belady import Belady


@dataclass(frozen=True, slots=True)
class SimPolicy:
    """How a simulator policy maps onto a runtime policy and the engine's own behaviour."""

    runtime: str
    offload: bool = False  # HiCache: host memory under the GPU's KV cache
    write_back: bool = False  # HiCache ``--hicache-write-policy write_back`` where maitred picks it
    # (``maitred.runtime.hicache``), else SGLang's default write_through
    typed: bool = False  # eviction follows the scheduler's priorities
    tiering: bool = False  # promotions load KV back from host memory ahead of the request
    oracle: bool = False  # the runtime is told each tool's true duration
    labels: bool = False  # MORI's engine patch: tier labels on the cache (may go down; host
    # copies of GPU-tier programs are dropped first); else priorities
    # ride on requests and ratchet (stock SGLang)
    preprefill: bool = True  # maitred's warmups (off: the same policy without pre-prefill, to measure them)

    def __post_init__(self) -> None:
        if not self.preprefill and self.runtime != "maitred":
            raise ValueError(f"preprefill: only the maitred runtime policy has warmups to turn off, not {self.runtime!r}")

    def policy(self) -> Policy:
        return Maitred(preprefill=False) if not self.preprefill else make_policy(self.runtime)


MAITRED_SIM = SimPolicy("maitred", offload=True, write_back=True, typed=True, tiering=True)

SIM_POLICIES: dict[str, SimPolicy] = {
    "round_robin": SimPolicy("round_robin"),
    "cache_aware": SimPolicy("cache_aware"),
    "thunderagent": SimPolicy("thunderagent"),
    "thunderagent_offload": SimPolicy("thunderagent", offload=True),
    "tao": SimPolicy("tao"),
    "mori": SimPolicy("mori", offload=True, typed=True, tiering=True, labels=True),
    "maitred": MAITRED_SIM,
    # maitred with its warmups off: what pre-prefill is worth, measured against ``maitred``
    "maitred_no_preprefill": replace(MAITRED_SIM, preprefill=False),
    # maitred on workers left at HiCache's default write_through: what write_back is worth
    "maitred_write_through": replace(MAITRED_SIM, write_back=False),
    "oracle": replace(MAITRED_SIM, oracle=True),
    # Belady's rule told each program's next request time (a heuristic, not a bound), on
    # the workers maitred runs (write-back below 2× host: more room for it too)
    "belady": SimPolicy("belady", offload=True, write_back=True, typed=True, tiering=True, labels=True),
}

#: maitred with one of its parts turned off, asked for by name (e.g. on the handoff workload)
ABLATIONS = frozenset({"maitred_no_preprefill", "maitred_write_through"})
#: What ``maitred bench replay`` runs unless told: every policy but the ablation variants.
DEFAULT_POLICIES = tuple(name for name in SIM_POLICIES if name not in ABLATIONS)


@dataclass(frozen=True, slots=True)
class RunConfig:
    policy: str
    concurrency: int
    cpu_ratio: float = 1.0
    duration_s: float = 3600.0
    seed: int = 0
    workers: int = 1
    gpu_tokens: int | None = None  # per worker; None: the profile's
    period_s: float | None = None  # None: the policy's own
    hold_timeout_s: float | None = None  # None: the policy's own
    stagger_s: float = 30.0  # slots start spread over this window
    #: each slot runs one program, in trace order, the slots ``start_gap_s`` apart, and the run
    #: ends when all have (a parity run against the live gateway); else they cycle, staggered at random
    once: bool = False
    start_gap_s: float = 0.0
    use_signature: bool = True  # readiness history per tool signature (else per tool; SPEC 7.2)
    busy_margin: float | None = None  # maitred's tier sizing (None: SignalConfig's default)
    overcommit_headroom: float | None = None
    journal: bool = False  # keep the core's decisions (``Replay.core.journal``)

    def __post_init__(self) -> None:
        if self.policy not in SIM_POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from: {', '.join(SIM_POLICIES)}")
        if self.concurrency < 1 or self.workers < 1:
            raise ValueError("concurrency and workers must be at least 1")
        if self.cpu_ratio < 0 or self.duration_s <= 0 or (self.period_s is not None and self.period_s <= 0):
            raise ValueError("cpu_ratio must be >= 0; duration_s and period_s positive")
        if self.hold_timeout_s is not None and self.hold_timeout_s <= 0:
            raise ValueError("hold_timeout_s must be positive")

    @property
    def cadence(self) -> Cadence:
        """The policy's cadence with this run's overrides (``RuntimeCore`` resolves it the same way)."""
        runtime = SIM_POLICIES[self.policy].runtime
        published = Belady.cadence if runtime == "belady" else make_policy(runtime).cadence
        return self.core_config().cadence(published)

    def core_config(self) -> CoreConfig:
        sim = SIM_POLICIES[self.policy]
        return CoreConfig(
            period_s=self.period_s, hold_s=self.hold_timeout_s, priorities=sim.typed and not sim.labels, journal=self.journal
        )

    @property
    def period(self) -> float:
        return self.cadence.period_s

    @property
    def sizing(self) -> dict[str, Any]:
        """maitred's GPU-tier sizing overrides, for ``SignalConfig``."""
        return {
            name: value
            for name, value in (("busy_margin", self.busy_margin), ("overcommit_headroom", self.overcommit_headroom))
            if value is not None
        }

    @property
    def hold(self) -> float:
        return self.cadence.hold_s


@dataclass
class RunResult:
    policy: str
    concurrency: int
    cpu_ratio: float
    throughput_tok_s: float
    ttft_mean_s: float
    ttft_p95_s: float
    latency_mean_s: float | None
    latency_p95_s: float | None
    prefix_hit_rate: float
    recomputed_tokens: int
    transfer_bytes: int
    tier_moves: int
    requests: int
    programs_completed: int
    warmups: int
    dp_fallback_share: float | None
    prediction_mae_s: float | None
    prediction_within_half_s: float | None
    gpu_tokens: int
    workers: int
    duration_s: float
    seed: int
    unlimited: bool = False
    handoff_ttft_mean_s: float | None = None  # first request of the agent a handoff went to
    handoff_requests: int = 0
