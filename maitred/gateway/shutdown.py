"""Graceful shutdown of ``maitred serve``: uvicorn's server with a drain before it stops.

uvicorn's own graceful shutdown closes the listening socket at once (new clients see a refused
connection, with no reason given) and, past its fixed timeout, cancels the requests still
running: each plain request then dies with a ``CancelledError`` traceback and an HTTP 500, each
stream is cut without its end, and their ``llm.end`` is never recorded. ``DrainingServer`` runs
``Proxy.drain`` first, while the socket still accepts: new model requests get a 503 saying the
gateway is shutting down (and ``/healthz`` answers 503, so a balancer sends elsewhere), those
in flight get ``--shutdown-timeout`` to finish, and the rest are ended with an error each
client can read. Then uvicorn's shutdown runs as usual, with nothing left to cancel, and the
app's lifespan drains the store (``--drain-timeout``). A second Ctrl-C stops waiting.
"""

import socket

import uvicorn

from maitred.gateway.proxy import Proxy


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, proxy: Proxy, *, shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self.proxy = proxy
        self.shutdown_timeout_s = shutdown_timeout_s

    def exit_now(self) -> None:
        """Stop without waiting for the requests in flight: each is ended with its error at once
        (a holder that lost its shard's lease must not go on serving beside the new one)."""
        self.shutdown_timeout_s = 0.0
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.proxy.drain(self.shutdown_timeout_s, forced=lambda: self.force_exit)
        await super().shutdown(sockets)
