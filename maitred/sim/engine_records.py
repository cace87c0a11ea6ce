"""The records of the engine model (``maitred.sim.engine``): a request as a worker runs it, the KV a
worker holds (a program's private segment, an agent's shared prefix) and the worker's counters.

Plain data, apart from the worker's behaviour, so the GPU side of the model and its host tier
(``maitred.sim.host_cache``) both use them without importing each other.
"""

from dataclasses import dataclass


@dataclass(slots=True)
class Request:
    program_id: str
    agent: str
    context: int  # whole prompt
    output: int
    arrival: float  # at the gateway (TTFT counts from here)
    prefix: int = 0  # the agent's shared system prompt within ``context``
    background: str | None = None  # warmup kind, None for a real request
    priority: int | None = None  # SGLang request priority (stock priority eviction, ratcheted)
    prefill_left: int = 0
    decode_left: int = 0
    ready_at: float = 0.0  # host-to-GPU load done
    first_token_at: float | None = None
    done_at: float | None = None
    hit_tokens: int = 0
    host_hit_tokens: int = 0  # the part of ``hit_tokens`` loaded back from host memory
    recomputed: int = 0


@dataclass(slots=True)
class Segment:
    """A program's private KV (its context beyond the shared prefix) on this worker."""

    agent: str
    gpu: int = 0  # context tokens [0, gpu) are on the GPU
    host: int = 0  # and [host_from, host) in host memory
    host_from: int = 0  # 0 with write-through; write-back copies from the first evicted token
    last: float = 0.0
    loading_until: float = 0.0


@dataclass(slots=True)
class Prefix:
    tokens: int
    resident: bool = False
    users: int = 0
    last: float = 0.0


@dataclass(slots=True)
class EngineStats:
    prompt_tokens: int = 0
    hit_tokens: int = 0
    recomputed_tokens: int = 0
    transfer_bytes: int = 0
    output_tokens: int = 0
    warmups: int = 0
