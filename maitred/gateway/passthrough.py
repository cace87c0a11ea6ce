"""Worker streams passed through to the client, chunk by chunk.

A stream is answered once its worker sent the first chunk (``Proxy._stream``); from then on
``Piped`` relays it, reads its usage on the way and records it once (before the client sees the
end, or when the stream breaks or the client leaves), and ``Relay`` makes sure the worker's
connection is let go however the client's side ends. A stream cut short (its worker failed under
it, or the gateway shut down, ``Proxy.drain``) ends with an error event in its own API's shape
(``broken_stream_event``). Kept apart from the proxy, which opens the streams and ends them at
shutdown, and which a stream reaches only through ``PipeOwner``.
"""

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import aiohttp
import orjson
from starlette.responses import StreamingResponse

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

    async def relay(self, first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        scanner = self.scanner
        try:
            out = scanner.feed(first)
            if out:
                yield out
            async for chunk in chunks:
                out = scanner.feed(chunk)
                if out:
                    if self.end in out:
                        await self._record_stored()
                    yield out
            rest = scanner.finish()
            await self._record_stored()
            if rest:
                yield rest
        except GatewayStopping as exc:
            self.ok = False
            self.record()
            yield broken_stream_event(self.call.route.api, str(exc), kind="service_unavailable")
        except (TimeoutError, *WORKER_DOWN) as exc:
            yield self._broken(exc)

    def cut(self, text: str) -> None:
        """End the stream at shutdown: the read it waits on raises ``GatewayStopping`` and the
        relay sends the stream's error event (``relay``); the worker sees the disconnect."""
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


class Relay(StreamingResponse):
    """A streaming response that always runs ``on_close`` — also when the client goes away
    mid-stream (Starlette skips the background task then), so no upstream connection leaks."""

    def __init__(self, content: AsyncIterator[bytes], *, on_close: Any, media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self._on_close = on_close
        self._after: Callable[[], None] | None = None

    def after_close(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the stream is over and ``on_close`` ran (the request's timing)."""
        self._after = callback

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
            if self._after is not None:
                self._after()


def broken_stream_event(api: str, text: str, *, kind: str = "worker_failed") -> bytes:
    """The last event of a stream cut short (its worker failed under it, or the gateway shut
    down), in the stream's own API."""
    if api == "anthropic":
        error = {"type": ANTHROPIC_KINDS.get(kind, "api_error"), "message": text}
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "error": error}) + b"\n\n"
    if api == "responses":
        return b"event: error\ndata: " + orjson.dumps({"type": "error", "code": kind, "message": text}) + b"\n\n"
    return b"data: " + orjson.dumps({"error": {"message": text, "type": kind}}) + b"\n\ndata: [DONE]\n\n"
