"""Assembles ``maitred serve``: the gateway app with its runtime, worker clients and store.

``build_app`` wires the parts and returns a FastAPI app whose lifespan opens the store (and
seeds tool statistics from it), reads the workers' capacities, starts the scheduler, and on
shutdown stops them in reverse and writes what is still queued for the store. Without workers
it is a telemetry-only service: hooks, events, programs, statistics and metrics work, and every
model route answers 503 saying the gateway runs without workers. Under ``--shard`` the parts that
act on the workers and the store start only once the gateway holds its shard's lease, at once or
on taking over from a holder that died (``standby``).
"""

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import aiohttp
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException

from maitred.gateway.backend import WorkerBackend
from maitred.gateway.front import GatewayApp, Guards
from maitred.gateway.guard import routing_error
from maitred.gateway.ingest import HookMapper, add_admin_routes
from maitred.gateway.lease import ShardLease
from maitred.gateway.loop import LiveConfig, LiveDriver
from maitred.gateway.metrics import Metrics
from maitred.gateway.origin import LOOPBACK_HOSTS, OriginGuard
from maitred.gateway.otlp_receiver import add_otlp_route
from maitred.gateway.pool import WorkerPool
from maitred.gateway.proxy import Proxy, add_proxy_routes
from maitred.gateway.proxy_config import ProxyConfig
from maitred.gateway.sglang.client import SGLangClient
from maitred.gateway.span_signals import span_signals
from maitred.gateway.standby import ShardConfig, ShardRole, StandbyGate, keep_shard, try_lease
from maitred.gateway.store_writer import StoreWriter
from maitred.gateway.top_tools import MAX_TOOLS
from maitred.gateway.trust import Tokens

if TYPE_CHECKING:
    from maitred.gateway.shard_link import ShardLink
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
    shard: ShardConfig | None = None  # serve only while holding this shard's lease (``standby``)


@dataclass
class Gateway:
    """The parts of a running gateway, for tests and benchmarks that look inside."""

    app: FastAPI
    runtime: LiveDriver
    control: WorkerPool  # health, load, capacity and warmup requests to the workers
    proxy: Proxy  # model requests
    loop: asyncio.AbstractEventLoop | None = None  # the serving event loop, once started
    shard: ShardRole | None = None  # under ``ServeConfig.shard``: holder or standby


def build_app(
    cfg: ServeConfig,
    *,
    hook_mapper: tuple[HookMapper | None, type[Exception]] | None = None,
    on_ready: Callable[[Gateway], None] | None = None,
    on_shutdown: Callable[[], None] | None = None,
    on_lease_lost: Callable[[], None] | None = None,
) -> Gateway:
    """``on_shutdown`` runs (in a thread) last in the app's shutdown: uvicorn re-raises the
    signal that stopped it once the app is down, so cleanup after ``uvicorn.run`` may never run.
    ``on_lease_lost`` (``cfg.shard``) runs on the event loop when the held lease failed, after
    the gateway stopped serving: ``maitred serve`` exits then."""
    if cfg.shard is not None and cfg.db_url is None:
        raise ValueError("a shard lease needs the PostgreSQL store it is kept in (db_url)")
    control = WorkerPool("control plane", 64, aiohttp.ClientTimeout(total=30.0, connect=5.0))
    backends: dict[str, WorkerBackend] = {url.rstrip("/"): SGLangClient(url.rstrip("/"), control.session) for url in cfg.workers}
    runtime = LiveDriver(backends, cfg.runtime, Metrics(cfg.metrics_max_tools), answer_when_stored=cfg.shard is not None)
    role = ShardRole(cfg.shard, runtime.metrics) if cfg.shard is not None else None

    async def serve_as_holder() -> None:
        """Start what acts on the workers and the store: at once, or once a standby won its
        shard's lease (``standby``)."""
        if cfg.shard is not None and cfg.db_url is not None:  # first: the programs restored are checked
            runtime.homes = _link_shards(runtime, cfg.db_url, cfg.shard.name)
        if cfg.db_url is not None:
            await _open_history(runtime, cfg.db_url, cfg.runtime.program_ttl_s)
        if cfg.otlp_endpoint is not None:
            from maitred.middleware.emitter import Emitter
            from maitred.middleware.otlp import OtlpSink

            sink = OtlpSink(cfg.otlp_endpoint, annotate=lambda event: span_signals(runtime.state, event, runtime.clock()))
            runtime.exporter, runtime.note_span = Emitter(sink, name="otlp"), sink.note
        await runtime.start(wait_for_workers_s=cfg.wait_for_workers_s)
        _log_up(cfg, runtime)
        if on_ready is not None:
            on_ready(gateway)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway.loop = asyncio.get_running_loop()
        await proxy.start()
        await control.start()
        lease, keeping = None, None
        try:
            if role is None:
                await serve_as_holder()
            else:
                lease, keeping = await _contend(cfg, role, serve_as_holder, on_lease_lost or (lambda: None))
        except BaseException:  # start-up failed: the connection pools opened above go with it
            await proxy.stop()
            await control.stop()
            raise
        # What start-up made lives as long as the process: out of the collector's sight, a full
        # collection (which a large request's allocations trigger) walks only what came later,
        # instead of holding the interpreter for tens of milliseconds (SGLang freezes it too).
        gc.freeze()
        try:
            yield
        finally:
            if keeping is not None:
                keeping.cancel()
                await asyncio.gather(keeping, return_exceptions=True)
            await runtime.stop()
            if runtime.homes is not None:
                await asyncio.to_thread(runtime.homes.close)
            await proxy.stop()
            await control.stop()
            if runtime.writer is not None:
                await asyncio.to_thread(runtime.writer.close, cfg.drain_timeout_s)
            if runtime.exporter is not None:
                await asyncio.to_thread(runtime.exporter.shutdown, cfg.drain_timeout_s)
            if lease is not None:  # last: a standby taking over restores what was just written
                await asyncio.to_thread(lease.close)
            if on_shutdown is not None:
                await asyncio.to_thread(on_shutdown)

    guards: Guards = [(StandbyGate, {"role": role})] if role is not None else []
    guards.append((OriginGuard, {"allowed_hosts": cfg.allowed_hosts}))  # outermost: last
    app = GatewayApp(
        guards=guards,
        title="maitred",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        exception_handlers={StarletteHTTPException: routing_error},
    )
    tokens = cfg.tokens or Tokens.of(cfg.token)
    proxy = Proxy(runtime, cfg.proxy, max_connections=cfg.max_connections, tokens=tokens)
    add_proxy_routes(app, proxy if cfg.workers else None)
    add_admin_routes(app, runtime, tokens=tokens, max_events_bytes=cfg.max_events_bytes, hook_mapper=hook_mapper, shard=role)
    add_otlp_route(app, runtime, tokens=tokens, max_bytes=cfg.max_events_bytes)
    gateway = Gateway(app, runtime, control, proxy, shard=role)
    return gateway


async def _open_history(runtime: LiveDriver, url: str, program_ttl_s: float) -> None:
    """Start the store writer; the tool statistics and open programs it finds seed the runtime."""
    loop = asyncio.get_running_loop()

    def seed(store: "SessionStore") -> None:  # in the writer thread; the state is the loop's
        rows, signatures = store.tool_stats_all(), store.tool_stats_all(by_signature=True)
        loop.call_soon_threadsafe(runtime.seed, rows, signatures)
        events = store.open_program_events(time.time() - program_ttl_s)
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


def _link_shards(runtime: LiveDriver, url: str, shard: str) -> "ShardLink":
    """Claim the programs this shard sees, and drop on the loop those another shard claims."""
    from maitred.gateway.shard_link import ShardLink

    loop = asyncio.get_running_loop()
    return ShardLink(
        url, shard, on_moved_away=lambda pid: loop.call_soon_threadsafe(runtime.moved_away, pid), metrics=runtime.metrics
    )


async def _contend(
    cfg: ServeConfig, role: ShardRole, serve: Callable[[], Awaitable[None]], on_lost: Callable[[], None]
) -> tuple[ShardLease, "asyncio.Task[None]"]:
    """Take the shard's lease if it is free (then serve at once, before the first request) and
    keep contending for it (or checking it) in the background (``standby.keep_shard``)."""
    assert cfg.shard is not None and cfg.db_url is not None
    lease = ShardLease(cfg.db_url, cfg.shard.name, label=cfg.shard.label)
    if await try_lease(lease, role):
        await serve()
        role.hold(lease.label)
        log.info("maitred: shard %s: holding the lease, serving", cfg.shard.name)
    return lease, asyncio.create_task(keep_shard(lease, role, serve=serve, on_lost=on_lost))


def _log_up(cfg: ServeConfig, runtime: LiveDriver) -> None:
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


def _open_store(url: str) -> "SessionStore":
    from maitred.storage import SessionStore

    return SessionStore(url)
