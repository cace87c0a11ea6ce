"""A connection pool to the workers, opened inside the serving event loop, as aiohttp requires.

The gateway keeps two: the model requests' (``proxy.Proxy``) and the control plane's (health,
load, capacity and warmup requests, ``app``), so that a pool full of streams never holds up a
health check. Idle connections are let go well before a worker's own keep-alive timeout
(uvicorn's and SGLang's: 5 s), so a request rarely goes out on a connection being closed.
"""

import aiohttp

KEEPALIVE_S = 2.0


class WorkerPool:
    """One ``aiohttp.ClientSession``, from ``start`` to ``stop``; ``session`` is its getter."""

    def __init__(self, purpose: str, max_connections: int, timeout: aiohttp.ClientTimeout, *, decompress: bool = True) -> None:
        self.purpose = purpose  # named in the error of a pool used before it was started
        self.max_connections = max_connections
        self.timeout = timeout
        self.decompress = decompress
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=KEEPALIVE_S)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout, auto_decompress=self.decompress)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError(f"the {self.purpose} pool is not started")
        return self._session

    def in_use(self) -> int:
        """Connections carrying a request now (0 when all went back to the pool, or before start)."""
        connector = self._session.connector if self._session is not None else None
        return sum(len(v) for v in getattr(connector, "_acquired_per_host", {}).values()) if connector else 0
