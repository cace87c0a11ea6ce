"""The gateway's ASGI app: the agents' hot routes go straight to their handlers, the rest through FastAPI.

A model request is the gateway's hot path, and an event batch or a hook call comes with every
tool call an agent makes. FastAPI's stack costs each of them on every request and a streamed
answer on every chunk: the error, telemetry, body-limit, exception and exit-stack middleware,
the router's match over every route, and a wrapper around ``send`` per layer that each chunk
passes through. None of it does anything for these routes: their handlers read and limit the
body themselves (``--max-body-mb``, ``--max-events-mb``), answer their own errors (in the
route's API shape), and an exception one does not catch reaches uvicorn, which logs it and
answers 500 when nothing was sent yet (what FastAPI's error middleware did). So ``GatewayApp``
answers ``POST`` on those paths (``post_ahead``) ahead of the stack, through the same guards the
stack applies (``Guards``: ``origin.OriginGuard`` and, under ``--shard``, ``standby.StandbyGate``),
and passes everything else (other methods and paths, the lifespan) to FastAPI.

Measured with 32 streamed chat requests at once through one simulated worker, the gateway's CPU
per request went from 0.98 to 0.70 ms.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]
#: The pure ASGI wrappers every request passes, outermost last, each with its options.
Guards = list[tuple[Callable[..., ASGIApp], dict[str, Any]]]


class GatewayApp(FastAPI):
    """FastAPI, with the hot ``POST`` routes served ahead of its stack (see the module docstring)."""

    def __init__(self, *, guards: Guards, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._guards = guards
        for guard, options in guards:
            self.add_middleware(guard, **options)
        self._ahead: dict[str, ASGIApp] = {}

    def post_ahead(self, path: str, handler: Handler) -> None:
        """Answer ``POST`` on ``path`` with ``handler``, behind the guards and ahead of the
        stack. The router holds the route too, so that another method gets its 405."""
        app: ASGIApp = _Entry(handler)
        for guard, options in self._guards:
            app = guard(app, **options)
        self._ahead[path] = app
        self.add_route(path, handler, methods=["POST"], include_in_schema=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ahead = self._ahead.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if ahead is not None:
            await ahead(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class _Entry:
    """A request in: the handler's response out, as a Starlette route would send it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive, send))
        await response(scope, receive, send)
