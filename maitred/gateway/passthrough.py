"""Worker streams passed through to the client, chunk by chunk.

A stream is answered once its worker sent the first chunk (``Proxy._stream``); from then on
``Piped`` relays it, reads its usage on the way and records it once (before the client sees the
end, or when the stream breaks or the client leaves), and ``Relay`` makes sure the worker's
connection is let go however the client's side ends. A stream cut short (its worker failed under
it, or the gateway shut down, ``Proxy.drain``) ends with an error event in its own API's shape
(``broken_stream_event``). Kept apart from the proxy, which opens the streams and ends them at
shutdown, and which a stream reaches only through ``PipeOwner``.
"""

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import orjson
from starlette.responses import Response
from starlette.types import Message, Receive, Send

from maitred.gateway.client_gone import disconnected
from maitred.gateway.guard import ANTHROPIC_KINDS
from maitred.gateway.loop import LiveDriver
from maitred.gateway.model_call import Call
from maitred.gateway.model_routes import STREAM_END
from maitred.gateway.proxy_config import ProxyConfig
from maitred.gateway.usage import SSEUsage, Usage

#: Connection-level failures: the worker may be gone (not that the request was bad).
WORKER_DOWN = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class GatewayStopping(Exception):
    """The gateway is shutting down and ends a stream still running (``Proxy.drain``)."""


class ClientLeft(Exception):
    """The client closed its connection mid-stream (``Relay``)."""


class PipeOwner(Protocol):
    """What a stream passed through needs of the proxy that opened it (``proxy.Proxy``)."""

    runtime: LiveDriver
    cfg: ProxyConfig
    _pipes: "set[Piped]"

    def _finish(self, call: Call, worker: str, usage: Usage, ttft_s: float | None, *, ok: bool) -> None: ...


class Piped:
    """One worker stream passed through to the client: its usage is read on the way and recorded
    once, before the client sees the end (so whatever the client does next finds it there), or
    when the stream breaks or the client leaves."""

    def __init__(
        self,
        proxy: PipeOwner,
        call: Call,
        worker: str,
        upstream: aiohttp.ClientResponse,
        release: Callable[[], None],
        ttft: float,
    ) -> None:
        self.proxy, self.call, self.worker, self.upstream, self.release, self.ttft = proxy, call, worker, upstream, release, ttft
        self.scanner = SSEUsage(drop_usage_only=call.injected_usage)
        self.end = STREAM_END[call.route.api]
        self.ok, self.recorded = True, False

    def record(self) -> None:
        if not self.recorded:
            self.recorded = True
            self.proxy._finish(self.call, self.worker, self.scanner.settle(), self.ttft, ok=self.ok)
            self.proxy.runtime.metrics.requests.labels(self.call.endpoint, "ok" if self.ok else "broken_stream").inc()

    async def _record_stored(self) -> None:
        """``record``, and under ``--shard`` wait until the record is in the store before the
        client sees the end (``LiveDriver.stored``)."""
        if not self.recorded:
            self.record()
            await self.proxy.runtime.stored()

    async def pump(self, first: bytes, send: Send) -> None:
        """Pass the stream to the client, ``first`` chunk and then each one as it is read, with
        its closing message. Read straight from the worker's connection and written straight to
        the client's: this runs once per chunk, so no generator or middleware stands between."""
        scanner, content, end = self.scanner, self.upstream.content, self.end
        try:
            chunk = first
            while chunk:
                out = scanner.feed(chunk)
                if out:
                    if end in out:
                        await self._record_stored()
                    await send(_body(out))
                chunk = await content.readany()
            rest = scanner.finish()
            await self._record_stored()
            if rest:
                await send(_body(rest))
        except ClientLeft:
            return  # nobody to send to; ``close`` records the stream and aborts it at the worker
        except GatewayStopping as exc:
            self.ok = False
            self.record()
            await send(_body(broken_stream_event(self.call.route.api, str(exc), kind="service_unavailable")))
        except (TimeoutError, *WORKER_DOWN) as exc:
            await send(_body(self._broken(exc)))
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def client_left(self) -> None:
        """The client closed its connection: the read the stream waits on raises ``ClientLeft``."""
        if not self.upstream.content.at_eof():
            self.upstream.content.set_exception(ClientLeft())

    def cut(self, text: str) -> None:
        """End the stream at shutdown: the read it waits on raises ``GatewayStopping`` and the
        stream sends its error event (``pump``); the worker sees the disconnect."""
        self.upstream.content.set_exception(GatewayStopping(text))

    def _broken(self, exc: BaseException) -> bytes:
        """The stream's last event when the worker failed or timed out under it."""
        self.ok = False
        if isinstance(exc, TimeoutError):
            text = f"worker {self.worker} did not finish within {self.proxy.cfg.request_timeout_s:.0f} s"
        else:
            self.proxy.runtime.worker_failed(self.worker, reason=type(exc).__name__)
            text = f"worker {self.worker} failed mid-stream ({type(exc).__name__}); the stream cannot be resumed"
        self.record()
        return broken_stream_event(self.call.route.api, text)

    async def close(self) -> None:
        self.proxy._pipes.discard(self)
        if self.ok and self.upstream.content.at_eof():
            self.upstream.release()  # read to the end: the connection goes back to the pool
        else:
            self.upstream.close()  # cut short: the worker sees the disconnect and aborts the request
        self.release()
        if not self.recorded:  # the client went away mid-stream
            self.ok = False
            self.record()


class Relay(Response):
    """A worker's stream as the client's answer (``Piped.pump``), whose connection to the worker
    is let go however the client's side ends (``Piped.close``).

    Starlette's ``StreamingResponse`` is not used: under uvicorn (ASGI spec 2.3) it runs each
    stream in an anyio task group beside a task that waits for the client to leave, and its
    chunks pass through an async generator; on a busy gateway that per-stream and per-chunk
    Python was measurable beside the system calls that move the bytes. Here the wait for the
    client to leave is one plain task that fails the worker read the stream is waiting on."""

    def __init__(self, piped: Piped, first: bytes, *, media_type: str) -> None:
        self.piped, self.first = piped, first
        self.status_code, self.media_type, self.background = 200, media_type, None
        self.init_headers()
        self._after: Callable[[], None] | None = None

    def after_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the stream is over and the worker's connection let go (the
        request's timing)."""
        self._after = callback

    async def __call__(self, scope: Any, receive: Receive, send: Send) -> None:
        piped = self.piped

        async def watch() -> None:
            await disconnected(receive)
            piped.client_left()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await piped.pump(self.first, send)
        finally:
            watcher.cancel()
            await asyncio.wait({watcher})  # so no task outlives the stream
            await piped.close()
            if self._after is not None:
                self._after()


def _body(chunk: bytes) -> Message:
    """One chunk of the stream's answer, more to follow."""
    return {"type": "http.response.body", "body": chunk, "more_body": True}


def broken_stream_event(api: str, text: str, *, kind: str = "worker_failed") -> bytes:
    """The last event of a stream cut short (its worker failed under it, or the gateway shut
    down), in the stream's own API."""
    if api == "anthropic":
        error = {"type": ANTHROPIC_KINDS.get(kind, "api_error"), "message": text}
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "error": error}) + b"\n\n"
    if api == "responses":
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "code": kind, "message": text}) + b"\n\n"
    return b"data: " + orjson.dumps({"error": {"message": text, "type": kind}}) + b"\n\ndata: [DONE]\n\n"
