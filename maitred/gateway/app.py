"""Assembles ``maitred serve``: the gateway app with its runtime, worker clients and store.

``build_app`` wires the parts and returns a FastAPI app whose lifespan opens the store (and
seeds tool statistics from it), reads the workers' capacities, starts the scheduler, and on
shutdown stops them in reverse and writes what is still queued for the store. Without workers
it is a telemetry-only service: hooks, events, programs, statistics and metrics work, and every
model route answers 503 saying the gateway runs without workers.
"""

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException

from maitred.gateway.guard import routing_error
from maitred.gateway.ingest import HookMapper, add_admin_routes
from maitred.gateway.loop import LiveConfig, LiveDriver
from maitred.gateway.metrics import Metrics
from maitred.gateway.origin import LOOPBACK_HOSTS, OriginGuard
from maitred.gateway.otlp_receiver import add_otlp_route
from maitred.gateway.proxy import Proxy, add_proxy_routes
from maitred.gateway.proxy_config import ProxyConfig
from maitred.gateway.sglang.client import SGLangClient
from maitred.gateway.span_signals import span_signals
from maitred.gateway.store_writer import StoreWriter
from maitred.gateway.top_tools import MAX_TOOLS
from maitred.gateway.trust import Tokens

if TYPE_CHECKING:
    from maitred.storage import SessionStore

log = logging.getLogger("maitred.service")


@dataclass(frozen=True)
class ServeConfig:
    workers: Sequence[str]
    db_url: str | None = None  # None: nothing is persisted (tests, benchmarks)
    token: str | None = None  # one unscoped token (``trust``); ``tokens`` adds scoped ones
    tokens: Tokens | None = None
    allowed_hosts: Sequence[str] = LOOPBACK_HOSTS  # ``Host`` names answered (``origin``); "*": any
    runtime: LiveConfig = field(default_factory=LiveConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    max_events_bytes: int = 16 << 20
    max_connections: int = 1024  # per gateway, to all workers together
    wait_for_workers_s: float = 0.0  # at start, wait this long for one healthy worker
    drain_timeout_s: float = 10.0  # at shutdown, how long queued events get to reach the store
    metrics_max_tools: int = MAX_TOOLS  # tools given a label of their own on /metrics; the rest are "other"
    otlp_endpoint: str | None = None  # also export the stored events as OpenTelemetry spans there


@dataclass
class Gateway:
    """The parts of a running gateway, for tests and benchmarks that look inside."""

    app: FastAPI
    runtime: LiveDriver
    client: httpx.AsyncClient  # control plane
    proxy: Proxy  # model requests
    loop: asyncio.AbstractEventLoop | None = None  # the serving event loop, once started


def build_app(
    cfg: ServeConfig,
    *,
    hook_mapper: tuple[HookMapper | None, type[Exception]] | None = None,
    on_ready: Callable[[Gateway], None] | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> Gateway:
    """``on_shutdown`` runs (in a thread) last in the app's shutdown: uvicorn re-raises the
    signal that stopped it once the app is down, so cleanup after ``uvicorn.run`` may never run."""
    # The control plane (health, load, capacity, warmups) speaks httpx; model requests go through
    # the proxy's own aiohttp pool (see gateway). Idle connections are let go well before a
    # worker's keep-alive timeout (uvicorn's and SGLang's: 5 s).
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=2.0)
    client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0, connect=5.0))
    backends = {url.rstrip("/"): SGLangClient(url.rstrip("/"), client) for url in cfg.workers}
    runtime = LiveDriver(backends, cfg.runtime, Metrics(cfg.metrics_max_tools))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if cfg.db_url is not None:
            loop = asyncio.get_running_loop()
            url = cfg.db_url

            def seed(store: "SessionStore") -> None:  # in the writer thread; the state is the loop's
                rows, signatures = store.tool_stats_all(), store.tool_stats_all(by_signature=True)
                loop.call_soon_threadsafe(runtime.seed, rows, signatures)
                events = store.open_program_events(time.time() - cfg.runtime.program_ttl_s)
                loop.call_soon_threadsafe(runtime.restore, events)

            runtime.writer = StoreWriter(
                lambda: _open_store(url),
                on_open=seed,
                on_drop=lambda reason, n: runtime.metrics.dropped_events.labels(reason).inc(n),
            )
            # Programs of a previous run are restored before the first request is served (the
            # callbacks above run on this loop before this wait returns); a store that is down
            # at start is not waited for beyond its own timeouts: its programs come back when
            # it opens, except those a request has brought back first.
            await asyncio.to_thread(runtime.writer.first_attempt.wait)
        if cfg.otlp_endpoint is not None:
            from maitred.middleware.emitter import Emitter
            from maitred.middleware.otlp import OtlpSink

            sink = OtlpSink(cfg.otlp_endpoint, annotate=lambda event: span_signals(runtime.state, event, runtime.clock()))
            runtime.exporter, runtime.note_span = Emitter(sink, name="otlp"), sink.note
        gateway.loop = asyncio.get_running_loop()
        await proxy.start()
        await runtime.start(wait_for_workers_s=cfg.wait_for_workers_s)
        healthy = [url for url, w in runtime.state.workers.items() if w.healthy]
        down = [url for url in runtime.state.workers if url not in healthy]
        if not cfg.workers:
            log.info("maitred: gateway up without workers: telemetry only (model routes answer 503)")
        else:
            log.info(
                "maitred: gateway up; policy %s; workers up: %s%s",
                cfg.runtime.policy,
                ", ".join(healthy) or "none yet",
                f"; not answering yet: {', '.join(down)}" if down else "",
            )
        # What start-up made lives as long as the process: out of the collector's sight, a full
        # collection (which a large request's allocations trigger) walks only what came later,
        # instead of holding the interpreter for tens of milliseconds (SGLang freezes it too).
        gc.freeze()
        if on_ready is not None:
            on_ready(gateway)
        try:
            yield
        finally:
            await runtime.stop()
            await proxy.stop()
            await client.aclose()
            if runtime.writer is not None:
                await asyncio.to_thread(runtime.writer.close, cfg.drain_timeout_s)
            if runtime.exporter is not None:
                await asyncio.to_thread(runtime.exporter.shutdown, cfg.drain_timeout_s)
            if on_shutdown is not None:
                await asyncio.to_thread(on_shutdown)

    app = FastAPI(
        title="maitred",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        exception_handlers={StarletteHTTPException: routing_error},
    )
    app.add_middleware(OriginGuard, allowed_hosts=cfg.allowed_hosts)
    tokens = cfg.tokens or Tokens.of(cfg.token)
    proxy = Proxy(runtime, cfg.proxy, max_connections=cfg.max_connections, tokens=tokens)
    add_proxy_routes(app, proxy if cfg.workers else None)
    add_admin_routes(app, runtime, tokens=tokens, max_events_bytes=cfg.max_events_bytes, hook_mapper=hook_mapper)
    add_otlp_route(app, runtime, tokens=tokens, max_bytes=cfg.max_events_bytes)
    gateway = Gateway(app, runtime, client, proxy)
    return gateway


def _open_store(url: str) -> "SessionStore":
    from maitred.storage import SessionStore

    return SessionStore(url)
