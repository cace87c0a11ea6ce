"""The timing rules both drivers share: each policy's cadence and hold bound, and SGLang's
priority encoding under its ratchet.

Plain data and arithmetic, no state: ``RuntimeCore`` (``maitred/runtime/core.py``) applies them
for the gateway on the wall clock and for the replay in virtual time.
"""

import math
from dataclasses import dataclass

#: maitred's bounded wait of a held request before it is let through anyway, live and in the
#: replay: ThunderAgent's 1,800 s. A forced request overfills the GPU and every running program
#: pays in evictions and recompute, so a short bound loses most where memory is shortest:
#: ``maitred bench replay --policy maitred --concurrency 80 --cpu-ratio 1 --hold-timeout S``
#: (BENCHMARKS.md, "Hold bound") on the 70B profile makes 361 tok/s at 300 s, 482 at 1,800 s
#: (ThunderAgent+offload 476), and on the H100 synthetic workload 799 at 300 s, 838 at 600 s,
#: 856 at 1,800 s. An SGLang server under overload queues requests without any bound, so a
#: gateway hold is no longer than what clients already meet there; a client whose request
#: timeout is shorter (the OpenAI SDK's and LiteLLM's 600 s) should raise it, or the operator
#: lower ``maitred serve --hold-timeout`` at that measured cost.
HOLD_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class Cadence:
    """When a policy runs and how long it lets a request wait, as its authors' code or paper says.

    ``period_s``: the periodic step. ``hold_s``: a held request is let through after this long.
    ``urgent_s``: a step this soon after a request is held (None: wait for the period)."""

    period_s: float
    hold_s: float
    urgent_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("period_s", "hold_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.urgent_s is not None and not (math.isfinite(self.urgent_s) and self.urgent_s >= 0):
            raise ValueError(f"urgent_s must be a number of seconds >= 0, got {self.urgent_s!r}")


#: Each epoch's priorities lie above every earlier epoch's (see ``encode_priority``); a policy's
#: own priorities stay within (-EPOCH_SPAN / 2, EPOCH_SPAN / 2).
EPOCH_SPAN = 1000


def encode_priority(policy_priority: int, now: float, started_at: float, epoch_s: float) -> int:
    """SGLang request priority for ``--radix-eviction-policy priority``.

    SGLang's ratchet: a cached prefix keeps the highest priority any request gave it, so a
    program once sent high cannot be demoted by sending it low. Priorities therefore rise with
    time — the policy's priority within an epoch of ``epoch_s``, every later epoch above every
    earlier one — and a program the policy demotes (it sends no requests while idle) is
    overtaken by the programs still running, instead of being lowered."""
    epoch = int(max(now - started_at, 0.0) / epoch_s)
    return epoch * EPOCH_SPAN + policy_priority
