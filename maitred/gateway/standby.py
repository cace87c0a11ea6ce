"""A standby per shard: of the ``maitred serve --shard NAME`` processes sharing a shard's
workers and store, the one holding the shard's lease (``maitred.gateway.lease``) serves and the
others wait, ready to take over.

A standby runs nothing that acts on the shared workers or the store (no scheduler, worker
polls, warmups or store writer: the holder's would be doubled): ``/healthz`` answers 503 naming
the holder, so a balancer sends it nothing, and every route under ``/v1`` (and ``/generate``)
answers 503 with ``Retry-After``. With ``--standby-hold SECONDS`` it first holds such a request
while its next tries of the lease tell whether the holder is gone, and serves it once it took
over, at most SECONDS in all (``StandbyGate``): the requests a balancer retries there while the
holder just died are answered after the takeover rather than refused. It tries the lease
every ``--lease-poll`` seconds; the try that wins starts the gateway exactly as a holder starts at once (``serve``): the store opened
and the open programs restored from it, the workers read, the scheduler started.

The holder asks its lease's connection ``SELECT 1`` every ``--lease-poll`` seconds. When the
connection fails the lease is gone (the server freed the lock with the session, and a standby
may hold it already): the holder stops serving at once (503 on the same routes) and ``on_lost``
ends the process, so two holders overlap at most one poll interval plus one answer timeout.
"""

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from maitred.gateway.guard import error_response
from maitred.gateway.lease import LeaseUnavailable, ShardLease
from maitred.gateway.live_config import LEASE_POLL_S
from maitred.gateway.metrics import Metrics
from maitred.gateway.model_routes import ENDPOINTS

log = logging.getLogger("maitred.service")

#: How often a request held by a standby (``--standby-hold``) looks whether it serves now.
HOLD_POLL_S = 0.01
HOLDER, STANDBY, LOST = "holder", "standby", "lost"
ROLES = (HOLDER, STANDBY, LOST)


@dataclass(frozen=True)
class ShardConfig:
    name: str  # ``--shard``
    label: str  # the lease session's ``application_name`` (``lease.lease_label``)
    poll_s: float = LEASE_POLL_S  # ``--lease-poll``
    hold_s: float = 0.0  # ``--standby-hold``: how long a standby holds a request for the lease


class ShardRole:
    """Where this gateway stands in its shard: what the gate, ``/healthz`` and ``/metrics`` read.

    ``role`` is ``standby`` until the lease is won, ``holder`` while it is held and the gateway
    serves, ``lost`` from the moment the held lease failed until the process exits."""

    def __init__(self, cfg: ShardConfig, metrics: Metrics) -> None:
        self.cfg, self.metrics = cfg, metrics
        self.holder: str | None = None  # the holder's ``application_name`` (None: nobody, or unknown)
        self.lost: str | None = None  # why the lease was lost
        self.unreachable: str | None = None  # why the last try could not ask the database
        self.tries = 0  # tries of the lease finished so far (``StandbyGate`` counts them)
        self.won = False  # the lease was won: starting as the holder
        self.role = STANDBY
        self._set(STANDBY)

    @property
    def serving(self) -> bool:
        return self.role == HOLDER

    def _set(self, role: str) -> None:
        self.role = role
        for r in ROLES:
            self.metrics.shard_role.labels(self.cfg.name, r).set(r == role)

    def hold(self, label: str, *, takeover_s: float | None = None) -> None:
        """Serving as the holder; ``takeover_s``: how long starting took after the lease was won."""
        self.holder = label
        self._set(HOLDER)
        if takeover_s is not None:
            self.metrics.takeover.labels(self.cfg.name).set(takeover_s)

    def lose(self, reason: str) -> None:
        self.lost, self.holder = reason, None
        self._set(LOST)

    def status(self) -> str:
        """``/healthz``'s status while this gateway does not serve."""
        if self.role == LOST:
            return f"shard {self.cfg.name}: lease lost ({self.lost}); exiting"
        if self.unreachable is not None:
            return f"standby for shard {self.cfg.name}: cannot ask for the lease ({self.unreachable})"
        return f"standby for shard {self.cfg.name}: the lease is held by {self.holder or 'nobody (taking it)'}"

    @property
    def retry_after(self) -> str:
        """Seconds a refused client should wait: a standby's next try of the lease."""
        return str(max(1, math.ceil(self.cfg.poll_s)))


class StandbyGate:
    """Answers the model and event routes (``/v1/...``, ``/generate``) with 503 and
    ``Retry-After`` while the gateway does not hold its shard's lease; ``/healthz`` and
    ``/metrics`` pass (they say why). Reads one attribute per request: a pure ASGI wrapper."""

    def __init__(self, app: ASGIApp, *, role: ShardRole) -> None:
        self.app, self.role = app, role

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        gated = scope["type"] == "http" and (path.startswith("/v1/") or path in ENDPOINTS)
        if not gated or self.role.serving or await self._held():
            await self.app(scope, receive, send)
            return
        route = ENDPOINTS.get(path)
        response = error_response(
            503,
            f"{self.role.status()}; send the request to the shard's address (its balancer) or retry shortly",
            kind="service_unavailable",
            headers={"retry-after": self.role.retry_after},
            anthropic=route is not None and route.anthropic,
        )
        await response(scope, receive, send)

    async def _held(self) -> bool:
        """Under ``--standby-hold``: whether this standby serves the request after holding it.
        A balancer sends a standby requests when the holder just failed them: the standby holds
        each until a try of the lease that began after it came has told (two tries: one may be
        under way), and then for as long as it takes over, at most ``hold_s`` in all. The
        request is served after the takeover; with the holder alive it is refused within two
        ``--lease-poll``, so a balancer that sends one here before its first check loses little."""
        role = self.role
        deadline = time.monotonic() + role.cfg.hold_s
        told = role.tries + 2
        while role.role == STANDBY and (role.won or role.tries < told) and time.monotonic() < deadline:
            await asyncio.sleep(HOLD_POLL_S)
        return role.serving


async def try_lease(lease: ShardLease, role: ShardRole) -> bool:
    """One try of the lease; while it is held elsewhere, ``role.holder`` names the holder."""
    try:
        if await asyncio.to_thread(lease.try_acquire):
            role.unreachable, role.won = None, True
            return True
        role.holder = await asyncio.to_thread(lease.holder)
        role.unreachable = None
    except Exception as exc:  # LeaseUnavailable, or anything unforeseen: a standby keeps trying
        if role.unreachable is None:  # once per outage, not once per poll
            log.warning(
                "maitred: shard %s: cannot ask for the lease (%s); trying every poll",
                role.cfg.name,
                exc,
                exc_info=not isinstance(exc, LeaseUnavailable),
            )
        role.holder, role.unreachable = None, str(exc)
    finally:
        role.tries += 1
    return False


async def keep_shard(
    lease: ShardLease,
    role: ShardRole,
    *,
    serve: Callable[[], Awaitable[None]],
    on_lost: Callable[[], None],
) -> None:
    """Wait for the lease (unless held already), start serving when it is won, then check it
    every poll until it fails: then stop serving and call ``on_lost``."""
    poll_s = role.cfg.poll_s
    if not role.serving:
        log.info("maitred: standby for shard %s; the lease is held by %s", role.cfg.name, role.holder or "nobody reachable")
        while not await try_lease(lease, role):
            await asyncio.sleep(poll_s)
        won = time.monotonic()
        log.info("maitred: shard %s: lease won; taking over", role.cfg.name)
        try:
            await serve()
        except Exception as exc:
            log.exception("maitred: shard %s: starting as the holder failed", role.cfg.name)
            role.lose(f"starting as the holder failed: {exc}")
            on_lost()
            return
        role.hold(lease.label, takeover_s=time.monotonic() - won)
        log.info(
            "maitred: shard %s: serving as the holder, %.3f s after winning the lease", role.cfg.name, time.monotonic() - won
        )
    try:
        while await asyncio.to_thread(lease.check):
            await asyncio.sleep(poll_s)
        reason = "its PostgreSQL session ended"
    except Exception as exc:  # a check that cannot run cannot vouch for the lease either
        log.exception("maitred: shard %s: checking the lease failed", role.cfg.name)
        reason = f"checking it failed: {exc}"
    role.lose(reason)
    log.error("maitred: shard %s: lease lost; refusing requests and exiting", role.cfg.name)
    on_lost()
