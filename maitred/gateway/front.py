"""The gateway's ASGI app: model requests go straight to the proxy, the rest through FastAPI.

A model request is the gateway's hot path, and FastAPI's stack costs it on every request and
every streamed chunk: the error, telemetry, body-limit, exception and exit-stack middleware,
the router's match over every route, and a wrapper around ``send`` per layer that each chunk
passes through. None of it does anything for a model route: the proxy reads and limits the
body itself (``--max-body-mb``), answers its own errors in the route's API shape, and an
exception it does not catch reaches uvicorn, which logs it and answers 500 when nothing was
sent yet (what FastAPI's error middleware did). So ``GatewayApp`` answers ``POST`` on the model
routes (``model_routes.ENDPOINTS``) ahead of the stack, through the same guards the stack
applies (``Guards``: ``origin.OriginGuard`` and, under ``--shard``, ``standby.StandbyGate``),
and passes everything else (other methods and paths, the lifespan) to FastAPI.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from maitred.gateway.model_routes import ENDPOINTS

Handler = Callable[[Request], Awaitable[Response]]
#: The pure ASGI wrappers every request passes, outermost last, each with its options.
Guards = list[tuple[Callable[..., ASGIApp], dict[str, Any]]]


class GatewayApp(FastAPI):
    """FastAPI, with the model routes served ahead of its stack (see the module docstring)."""

    def __init__(self, *, guards: Guards, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._guards = guards
        for guard, options in guards:
            self.add_middleware(guard, **options)
        self._model_routes: ASGIApp | None = None

    def serve_model_routes(self, handler: Handler) -> None:
        """Answer ``POST`` on every model route with ``handler``, behind the guards."""
        app: ASGIApp = _Entry(handler)
        for guard, options in self._guards:
            app = guard(app, **options)
        self._model_routes = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._model_routes is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in ENDPOINTS
        ):
            await self._model_routes(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class _Entry:
    """A model request in: the handler's response out, as a Starlette route would send it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive, send))
        await response(scope, receive, send)
