"""The gateway's model routes, the one table every part of the proxy reads.

Which paths are model routes, the API each speaks (so errors and a cut stream's last event
take that API's shape) and whether it generates (admitted and accounted) or only asks
(``count_tokens``). The proxy (``proxy``), the streams it passes through (``passthrough``),
the body-field allow-lists (``fields``) and a gateway started without workers (``no_workers``)
all go by it, so it lives apart from any of them.
"""

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from maitred.gateway.guard import error_response


@dataclass(frozen=True, slots=True)
class Route:
    """One model route: its name (the metrics label), the API it speaks, and whether it
    generates (admitted, accounted) or only asks (``count_tokens``: passed to a worker as is)."""

    name: str
    api: str  # "openai", "anthropic", "responses" or "sglang"
    generates: bool = True

    @property
    def anthropic(self) -> bool:
        return self.api == "anthropic"


ENDPOINTS = {
    "/v1/chat/completions": Route("chat", "openai"),
    "/v1/completions": Route("completions", "openai"),
    "/v1/responses": Route("responses", "responses"),
    "/v1/messages": Route("messages", "anthropic"),
    "/v1/messages/count_tokens": Route("count_tokens", "anthropic", generates=False),
    "/generate": Route("generate", "sglang"),
}
#: The event after which a stream of each API has told its usage (the proxy records it then,
#: before the client sees the end).
STREAM_END = {
    "openai": b"data: [DONE]",
    "sglang": b"data: [DONE]",
    "anthropic": b"event: message_stop",
    "responses": b"event: response.completed",
}


NO_WORKERS = (
    "this gateway runs without workers (telemetry only: hooks, events, programs, statistics and metrics); "
    "start it with --worker URL to serve models"
)


async def no_workers(request: Request) -> Response:
    """Every model route of a gateway started without workers."""
    route = ENDPOINTS.get(request.scope["path"])
    return error_response(503, NO_WORKERS, kind="no_workers", anthropic=route is not None and route.anthropic)
