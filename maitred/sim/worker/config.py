"""The settings of one simulated SGLang worker (``maitred sim-worker``, ``SimWorkerThread``).

A plain, validated value that imports nothing of the server: the command line
(``maitred.sim.worker.server``) builds it on every ``maitred`` call, and the server's state
(``maitred.sim.worker.state``) and app read it, so it sits below both of them.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maitred.sim.worker.session_script import SessionScript

#: A local model folder with a small word-level tokenizer.json, so sglang-router can load the
#: worker's tokenizer without contacting a model hub.
MODEL_DIR = Path(__file__).parent / "assets" / "sim-model"
SERVED_MODEL_NAME = "maitred-sim-worker"
#: SGLang's ``--hicache-write-policy`` values the engine model runs (not ``write_through_selective``).
WRITE_POLICIES = ("write_through", "write_back")


@dataclass(frozen=True)
class SimWorkerConfig:
    """Settings of one simulated worker. ``gpu_tokens`` None: the engine profile's capacity;
    ``cpu_tokens`` 0: no host cache (HiCache off, SGLang's default). ``hicache_write_policy`` is
    SGLang's: ``write_through`` (its default) copies each block to host memory as it is cached,
    ``write_back`` when it leaves the GPU (the eviction waits for the copy)."""

    gpu_tokens: int | None = None
    cpu_tokens: int = 0
    time_scale: float = 1.0
    script_tools: bool = False
    script_steps: int = 3
    script: "SessionScript | None" = None  # --script: whole sessions answered from a file
    profile: str | None = None
    model_path: str = str(MODEL_DIR)
    served_model_name: str = SERVED_MODEL_NAME
    radix_eviction_policy: str = "lru"
    hicache_write_policy: str = "write_through"
    kv_events_config: str | None = None  # SGLang's --kv-events-config JSON (zmq publisher)
    host: str = "127.0.0.1"
    port: int = 30000  # 0: any free port (SimWorkerThread)
    #: How often a non-streamed request looks whether its client is still connected, aborting it
    #: when not: SGLang's SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s; ``--abort-check``).
    abort_check_s: float = 4.0

    def __post_init__(self) -> None:
        if self.gpu_tokens is not None and (isinstance(self.gpu_tokens, bool) or self.gpu_tokens < 1):
            raise ValueError(f"gpu_tokens: must be a positive number of tokens, got {self.gpu_tokens!r}")
        if isinstance(self.cpu_tokens, bool) or self.cpu_tokens < 0:
            raise ValueError(f"cpu_tokens: must be 0 (no host cache) or a positive number of tokens, got {self.cpu_tokens!r}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale: must be a positive, finite factor, got {self.time_scale!r}")
        if self.script_steps < 0:
            raise ValueError(f"script_steps: must be 0 or more, got {self.script_steps!r}")
        if not (math.isfinite(self.abort_check_s) and self.abort_check_s > 0):
            raise ValueError(f"abort_check_s: must be a positive, finite number of seconds, got {self.abort_check_s!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be between 0 and 65535, got {self.port!r}")
        if self.radix_eviction_policy not in ("lru", "priority"):
            raise ValueError(f"radix_eviction_policy: choose lru or priority, got {self.radix_eviction_policy!r}")
        if self.hicache_write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy: choose {' or '.join(WRITE_POLICIES)}, got {self.hicache_write_policy!r}")
