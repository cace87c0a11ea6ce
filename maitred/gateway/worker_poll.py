"""Polling the workers' health and load on the driver's cadence (``LiveDriver`` part).

Every ``LiveConfig.poll_s`` each worker is asked how it is (``WorkerWatch``), and programs
silent past ``program_ttl_s`` are swept; a request that finds no worker up is told which
workers do not answer (``NoWorkerAvailable``, a 503).
"""

import asyncio
import logging
from collections.abc import Callable, Container

from maitred.gateway.health import WorkerWatch
from maitred.gateway.live_config import LiveConfig
from maitred.runtime.state import RuntimeState

log = logging.getLogger("maitred.service")


class NoWorkerAvailable(RuntimeError):
    """Every worker is down: the request cannot be served (the gateway answers 503)."""


class WorkerPolling:
    """The polling task and what follows from a worker going down (a mixin of ``LiveDriver``)."""

    state: RuntimeState
    cfg: LiveConfig
    watch: WorkerWatch
    clock: Callable[[], float]
    _held: Container[str]
    drop: Callable[[str, float], bool]

    def worker_failed(self, url: str, *, reason: str) -> None:
        """``url`` is down (a request to it failed): see ``WorkerWatch.failed``."""
        self.watch.failed(url, reason=reason)

    async def _poll_loop(self) -> None:
        last_sweep = self.clock()
        while True:
            await asyncio.sleep(self.cfg.poll_s)
            try:
                await self.watch.check_all()
                now = self.clock()
                if now - last_sweep >= min(60.0, self.cfg.program_ttl_s):
                    last_sweep = now
                    self._forget_silent(now)
            except Exception:
                log.exception("maitred: worker polling failed")

    def _forget_silent(self, now: float) -> None:
        stale = [
            pid
            for pid, p in self.state.programs.items()
            if now - p.phase_since > self.cfg.program_ttl_s and pid not in self._held
        ]
        for pid in stale:
            self.drop(pid, now)

    def no_worker(self) -> NoWorkerAvailable:
        """Why no worker can take a request, naming the workers that do not answer."""
        down = [url for url, w in self.state.workers.items() if not w.healthy]
        return NoWorkerAvailable("no healthy worker" + (f" (not answering: {', '.join(down)})" if down else ""))
