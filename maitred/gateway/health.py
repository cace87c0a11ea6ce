"""Which workers are up, and what each can hold: health checks, capacity and load, on the wall clock.

A worker is declared down after ``fail_after`` failed health checks in a row (or at once when a
request to it fails); its programs then lose their KV and are placed elsewhere by the next step.
A worker that comes back has its capacity read again (it may have been restarted with other
flags) before it takes programs.

A poll asks only what the gateway does not already know: a load the step read since the last
poll (``refresh_loads``) is not read again, and a worker that answered a request in full since
then is asked ``/health`` only at every other poll. Not never: SGLang's ``/health`` also
answers 503 while the server drains after SIGTERM, when it still answers the requests it has;
so ``/health`` is asked at least every second interval, and at every one once it failed, until
it passes (a draining worker is declared down at most one interval later than before). An idle
worker, or one whose requests stopped coming back, is polled as before.
"""

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from maitred.gateway.backend import WorkerBackend
from maitred.gateway.metrics import Metrics
from maitred.gateway.sglang.client import WorkerError
from maitred.runtime.hicache import WRITE_BACK_BELOW_RATIO, write_back_for
from maitred.runtime.state import RuntimeState

log = logging.getLogger("maitred.service")
#: the longest a step waits for a worker's load before planning on its last reading
LOAD_TIMEOUT_S = 0.2


@dataclass(slots=True)
class _Health:
    failures: int = 0
    known: bool = False  # capacity read at least once
    write_policy: str | None = None  # HiCache's, as /server_info says (None: off, or not said)
    warned: bool = False  # the write-policy warning was logged
    answered_at: float = -math.inf  # monotonic: the last request the worker answered in full
    load_at: float = -math.inf  # monotonic: the last load reading
    skipped: bool = False  # the last poll did not ask /health (the next one does)


class WorkerWatch:
    def __init__(
        self,
        backends: Mapping[str, WorkerBackend],
        state: RuntimeState,
        metrics: Metrics,
        *,
        fail_after: int,
        policy: str,
        on_change: Callable[[], None],
        fresh_s: float,
    ) -> None:
        self.backends, self.state, self.metrics = backends, state, metrics
        self.fail_after, self.policy, self.on_change = fail_after, policy, on_change
        self.fresh_s = fresh_s  # the polling interval: what was learned within it is not asked again
        self._health = {url: _Health() for url in backends}
        for url in backends:  # at 0 from the start, so ``increase()`` sees a worker's first failure
            metrics.worker_failures.labels(url)

    def add(self, url: str) -> None:
        """A worker added to ``backends`` after start (``LiveDriver.add_worker``)."""
        self._health.setdefault(url, _Health())
        self.metrics.worker_failures.labels(url)

    def answered(self, url: str) -> None:
        """A request to ``url`` was answered in full: the worker is alive (a poll may skip ``/health``)."""
        health = self._health.get(url)
        if health is not None:
            health.answered_at = time.monotonic()

    async def refresh_loads(self) -> None:
        """Each healthy worker's load (``/v1/loads``) read just before a step plans, as the replay
        observes its engines at every step: a policy that counts the engine's own KV use
        (ThunderAgent's shared tokens) plans on what is there now, not on the last poll. A
        worker that does not answer within ``LOAD_TIMEOUT_S`` keeps its last reading (its
        health is the polling's business)."""
        urls = [url for url, w in self.state.workers.items() if w.healthy]
        loads = await asyncio.gather(
            *(asyncio.wait_for(self.backends[url].load(), LOAD_TIMEOUT_S) for url in urls), return_exceptions=True
        )
        read_at = time.monotonic()
        for url, load in zip(urls, loads):
            if not isinstance(load, BaseException):
                self._health[url].load_at = read_at
                self.state.observe_worker(url, queued_requests=load.waiting, used_tokens=load.used_tokens)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(url) for url in self.backends))

    async def check(self, url: str) -> None:
        backend, health, live = self.backends[url], self._health[url], self.state.workers[url]
        since = time.monotonic() - self.fresh_s
        busy = health.answered_at > since and health.load_at > since
        if live.healthy and health.known and busy and not health.failures and not health.skipped:
            health.skipped = True  # it answered a request and the step read its load: ask next time
            return
        health.skipped = False
        if not await backend.healthy():
            health.failures += 1
            if live.healthy and health.failures >= self.fail_after:
                self.failed(url, reason="health check")
            return
        try:
            if not health.known or not live.healthy:
                await self._read_capacity(url)
            load = await backend.load() if not live.healthy or health.load_at <= since else None
        except WorkerError as exc:
            log.warning("maitred: worker %s answers /health but not %s", url, exc)
            return
        health.failures = 0
        if load is not None:
            health.load_at = time.monotonic()
            self.state.observe_worker(url, queued_requests=load.waiting, used_tokens=load.used_tokens)
        if not live.healthy:
            hicache = f"HiCache {health.write_policy or 'write policy not reported'}" if live.cpu_tokens else "no host cache"
            log.info(
                "maitred: worker %s is up (%d GPU tokens, %d host tokens, %s)", url, live.gpu_tokens, live.cpu_tokens, hicache
            )
            self.state.set_worker_health(url, True)
            self.on_change()

    async def _read_capacity(self, url: str) -> None:
        """GPU and host KV capacity, and whether the host pool adds to the GPU's (HiCache
        write-back) or mirrors it (write-through), from the worker's ``/server_info``. Under
        maitred, a worker on write-through whose host pool is small enough for maitred to pick
        write-back (``maitred.runtime.hicache``) is named once in a warning."""
        backend, health, live = self.backends[url], self._health[url], self.state.workers[url]
        cap = await backend.capacity()
        host = cap.host_tokens
        if host is None:
            host = await backend.host_capacity() or 0
        live.gpu_tokens, live.cpu_tokens, live.write_back = cap.gpu_tokens, host, cap.write_back
        health.known, health.write_policy = True, cap.write_policy
        ratio = host / cap.gpu_tokens if cap.gpu_tokens else 0.0
        if self.policy == "maitred" and host and not cap.write_back and write_back_for(ratio) and not health.warned:
            health.warned = True
            log.warning(
                "maitred: worker %s keeps a host KV pool of %.3g GPUs without --hicache-write-policy write_back "
                "(%s): host memory mirrors the GPU, so maitred counts only the part beyond the GPU's size; "
                "start SGLang with --hicache-write-policy write_back (as maitred sglang-args does for a host "
                "pool under %g GPUs) to count all of it, at the cost of an eviction waiting for its copy to "
                "host memory",
                url,
                ratio,
                cap.write_policy or "write policy not reported",
                WRITE_BACK_BELOW_RATIO,
            )

    def failed(self, url: str, *, reason: str) -> None:
        """``url`` is down: its programs lose their KV and become homeless, to be placed on
        another worker by the next step (which this triggers)."""
        self.metrics.worker_failures.labels(url).inc()
        if self.state.workers[url].healthy:
            log.warning("maitred: worker %s is down (%s); re-placing its programs", url, reason)
            self.state.set_worker_health(url, False)
            self._health[url].failures = max(self._health[url].failures, self.fail_after)
            self.on_change()
