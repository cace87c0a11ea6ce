"""One model request on its way through the proxy: what the proxy made of the client's request.

Shared by the proxy (``proxy``), which builds it and sends it, and the streams it passes
through (``passthrough``), which account for it when they end.
"""

from dataclasses import dataclass
from typing import Any

from maitred.gateway.model_routes import Route
from maitred.gateway.tracecontext import TraceContext
from maitred.gateway.usage import PromptSize


@dataclass(slots=True)
class Call:
    """One client request on its way through."""

    route: Route
    path: str
    body: dict[str, Any]
    raw: bytes
    changed: bool
    program_id: str
    anonymous: bool
    stream: bool
    request_id: str
    injected_usage: bool = False
    size: PromptSize | None = None
    dropped: tuple[str, ...] = ()  # body fields not forwarded (``fields.screen_fields``)
    trace: TraceContext | None = None  # the client's W3C trace context, passed on to the worker

    @property
    def trace_id(self) -> str | None:
        return self.trace.trace_id if self.trace is not None else None

    @property
    def endpoint(self) -> str:
        return self.route.name
