"""Bounds on client connections that uvicorn leaves open: slow headers, slow bodies, too many.

uvicorn closes a connection that idles *between* requests (``timeout_keep_alive``), but not one
that opens and sends nothing, drips its request headers a byte at a time, or drips its body:
each holds a file descriptor for as long as the client likes, before any route (or token
check) runs, so a few hundred of them lock every new client out of a process limited to that
many descriptors (a slowloris). ``guarded_protocol`` makes uvicorn's own HTTP protocol class
(httptools when installed, else h11: what uvicorn's ``auto`` picks) enforce:

- ``header_timeout_s``: a request's headers must be complete this long after the connection
  opened, or after the first byte following the previous answer; else 408 and closed;
- ``body_timeout_s``: its body must be complete this long after its headers; else 408 (or, once
  the answer has started, just closed) and the app sees the client leave;
- ``max_connections``: at the cap, a new connection displaces the one that has waited longest
  for its request headers (a dripping or idle client, never one being answered); when every
  connection is busy with a request, the new one is answered 503 and closed. The default keeps
  the gateway below its file-descriptor limit, each client connection counting twice (it may
  hold a connection to a worker too).

The checks are timers on the event loop, like uvicorn's keep-alive timer: nothing runs per byte.
"""

import asyncio
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from maitred.gateway.guard import error_body

#: Descriptors kept for everything but client connections: listeners, the store, logs, and the
#: control plane's pool to the workers (up to 64).
RESERVED_FDS = 128
MAX_DEFAULT_CONNECTIONS = 4096


def default_max_connections(fd_limit: int | None = None) -> int:
    """Client connections the gateway accepts at once by default: half of the descriptors left
    after ``RESERVED_FDS`` (a client connection may hold one to a worker too), at least 16, at
    most ``MAX_DEFAULT_CONNECTIONS``."""
    if fd_limit is None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fd_limit = MAX_DEFAULT_CONNECTIONS * 2 + RESERVED_FDS if soft == resource.RLIM_INFINITY else soft
    return max(16, min(MAX_DEFAULT_CONNECTIONS, (fd_limit - RESERVED_FDS) // 2))


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """``maitred serve --header-timeout``, ``--body-timeout`` and ``--max-client-connections``."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 0  # 0: ``default_max_connections()``

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"{name}: must be a positive number of seconds, got {value!r}")
        if isinstance(self.max_connections, bool) or self.max_connections < 0:
            raise ValueError(f"max_connections: must be a positive number (0: the default), got {self.max_connections!r}")

    @property
    def connections(self) -> int:
        return self.max_connections or default_max_connections()


def _answer(status: int, reason: str, message: str, field: str, kind: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection (written before any request runs)."""
    body = error_body(message, field=field, kind=kind)
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    return head.encode() + body


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (``http=`` of ``uvicorn.run``) with ``limits`` enforced."""
    cap = limits.connections
    slow_head = _answer(
        408,
        "Request Timeout",
        f"request headers not complete within {limits.header_timeout_s:g} s (--header-timeout)",
        "headers",
        "request_timeout",
    )
    slow_body = _answer(
        408,
        "Request Timeout",
        f"request body not complete within {limits.body_timeout_s:g} s of its headers (--body-timeout)",
        "body",
        "request_timeout",
    )
    full = _answer(
        503,
        "Service Unavailable",
        f"the gateway is serving {cap} connections, its limit (--max-client-connections); retry shortly",
        "connection",
        "service_unavailable",
    )
    displaced = _answer(
        503,
        "Service Unavailable",
        f"closed to make room: the gateway is at its limit of {cap} connections (--max-client-connections) "
        "and this one had sent no complete request",
        "connection",
        "service_unavailable",
    )
    base: Any = AutoHTTPProtocol  # uvicorn's protocol classes are typed loosely

    class GuardedHTTPProtocol(base):
        """uvicorn's protocol, plus the deadlines and the cap of ``limits`` (see the module)."""

        _deadline: asyncio.TimerHandle | None = None
        _seen_cycle: Any = None  # the request whose headers were last seen complete
        waiting_since: float | None = None  # when it began waiting for a request's headers

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > cap and not self._displace_one():
                transport.write(full)
                transport.close()
                return
            self._wait_for_head()

        def data_received(self, data: bytes) -> None:
            if self._idle() and self._deadline is None:
                self._wait_for_head()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._seen_cycle:  # a request's headers are complete
                self._seen_cycle = cycle
                self.waiting_since = None
                self._cancel()
                if cycle.more_body:
                    self._deadline = self.loop.call_later(limits.body_timeout_s, self._body_late, cycle)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.waiting_since = self.loop.time()  # idle until its next request: may be displaced

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _idle(self) -> bool:
            """Between requests: none has had its headers yet, or the last one was answered."""
            return self.cycle is None or (self.cycle is self._seen_cycle and self.cycle.response_complete)

        def _wait_for_head(self) -> None:
            self._cancel()
            self.waiting_since = self.loop.time()
            self._deadline = self.loop.call_later(limits.header_timeout_s, self._head_late, self.cycle)

        def _cancel(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _head_late(self, cycle: Any) -> None:
            self._deadline = None
            if self.cycle is cycle and not self.transport.is_closing():
                self.transport.write(slow_head)
                self.transport.close()

        def _body_late(self, cycle: Any) -> None:
            self._deadline = None
            if self.cycle is not cycle or not cycle.more_body or self.transport.is_closing():
                return
            if not cycle.response_started:
                self.transport.write(slow_body)
            cycle.disconnected = True  # the app's next receive() says the client left; its answer goes nowhere
            cycle.message_event.set()
            self.transport.close()

        def _displace_one(self) -> bool:
            """Close the connection that has waited longest for request headers, if any does."""
            waiting = [p for p in self.connections if p is not self and getattr(p, "waiting_since", None) is not None]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda p: p.waiting_since)
            oldest.waiting_since = None
            if oldest._deadline is not None:  # part of a request came (or nothing yet): say why
                oldest.transport.write(displaced)
            oldest._cancel()  # (idle after an answer: closed quietly, as a keep-alive timeout would)
            oldest.transport.close()
            return True

    return GuardedHTTPProtocol
