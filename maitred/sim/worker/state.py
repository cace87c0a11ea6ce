"""One simulated worker's state: its settings, its capacity, its engine and its KV-event publisher.

A class of its own so that every part of the server that reads it (the app's information
endpoints, the generation endpoints, the load report and metrics) imports it from here and none
of them imports another to get it.
"""

import time
from collections import deque

from maitred.sim.engine import WorkerModel
from maitred.sim.profile import EngineProfile
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.engine import RealtimeEngine
from maitred.sim.worker.kv_events import KVEventPublisher, KVEventsConfig

CONTEXT_LENGTH = 131_072  # the bundled config.json's max_position_embeddings
#: Generation requests whose W3C ``traceparent`` the worker keeps, newest last (what a test of
#: trace propagation through the gateway reads; SGLang joins its request spans to that trace).
TRACE_CONTEXTS_KEPT = 1_000


class SimWorker:
    """One simulated worker: its settings, its capacity and its engine."""

    def __init__(self, config: SimWorkerConfig) -> None:
        self.config = config
        try:
            self.profile = EngineProfile.load(config.profile) if config.profile else EngineProfile()
        except ValueError as exc:
            raise ValueError(f"--profile: {exc}") from None
        self.gpu_tokens = config.gpu_tokens or self.profile.gpu_kv_tokens
        self.cpu_tokens = config.cpu_tokens
        typed = config.radix_eviction_policy == "priority"
        worker = WorkerModel(
            "sim",
            self.profile,
            self.gpu_tokens,
            self.cpu_tokens,
            offload=self.cpu_tokens > 0,
            typed_eviction=typed,
            write_back=config.hicache_write_policy == "write_back",
        )
        self.engine = RealtimeEngine(worker, config.time_scale)
        self.started = time.time()
        #: ``(path, traceparent)`` of the latest generation requests that carried one.
        self.trace_contexts: deque[tuple[str, str]] = deque(maxlen=TRACE_CONTEXTS_KEPT)
        self.max_input = min(CONTEXT_LENGTH, self.gpu_tokens) - 1
        self.kv_events = KVEventsConfig.parse(config.kv_events_config) if config.kv_events_config else None
        self.publisher = KVEventPublisher(self.kv_events, self.engine) if self.kv_events else None
        if self.publisher is not None:
            self.engine.on_change = self.publisher.publish
