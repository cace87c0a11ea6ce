"""What every gateway endpoint checks of a request's body (its size, that it is a JSON object), and the
one error shape of what maitred refuses. Tokens and their scopes are ``maitred.gateway.trust``.

Errors are JSON ``{"error": {"message", "type", "field"}}`` with a 4xx status, the shape OpenAI
clients already print, naming what was wrong. On Anthropic's routes (``/v1/messages``) they take
Anthropic's shape instead, ``{"type": "error", "error": {"type", "message"}}``, which the
Anthropic SDKs (and Claude Code) parse and print; the message still names the field.
"""

from typing import Any

import orjson
from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response


class HTTPProblem(Exception):
    """Answer the request with ``status`` and a message naming ``field``."""

    def __init__(self, status: int, message: str, *, field: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.kind = status, message, field, kind

    def response(self, *, anthropic: bool = False) -> Response:
        return error_response(self.status, self.message, field=self.field, kind=self.kind, anthropic=anthropic)


#: Anthropic's error ``type`` for each kind of error the gateway gives; its API names only a
#: few (invalid_request_error, authentication_error, request_too_large, overloaded_error,
#: api_error, ...), and its SDKs retry ``overloaded_error`` like a 529.
ANTHROPIC_KINDS = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "service_unavailable": "overloaded_error",
    "no_workers": "api_error",
}


def error_body(message: str, *, field: str | None = None, kind: str = "invalid_request_error", anthropic: bool = False) -> bytes:
    """The JSON of one error, in OpenAI's shape or (``anthropic``) in Anthropic's."""
    if anthropic:
        return orjson.dumps({"type": "error", "error": {"type": ANTHROPIC_KINDS.get(kind, "api_error"), "message": message}})
    body: dict[str, Any] = {"message": message, "type": kind}
    if field is not None:
        body["field"] = field
    return orjson.dumps({"error": body})


def error_response(
    status: int,
    message: str,
    *,
    field: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
    anthropic: bool = False,
) -> Response:
    content = error_body(message, field=field, kind=kind, anthropic=anthropic)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


class ClientGone(Exception):
    """The client closed its connection before its request was answered (mid-body, cut off by
    ``--body-timeout``, while it was held, or while a worker was answering it, whose connection
    is then closed so the generation stops): nobody reads an answer, and nothing more is sent
    for it. Not an error of the gateway's: logged at DEBUG at most, never as a traceback."""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes — before reading it when the
    client says its length, while reading it when it does not."""
    try:
        return await _read_body(request, limit)
    except ClientDisconnect:
        raise ClientGone from None


async def _read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise HTTPProblem(400, f"content-length: not a number: {length[:32]!r}", field="content-length")
        if int(length) > limit:
            raise HTTPProblem(
                413, f"body of {int(length):,} bytes is over the limit of {limit:,}", field="body", kind="request_too_large"
            )
        return await request.body()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPProblem(413, f"body is over the limit of {limit:,} bytes", field="body", kind="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HTTPProblem(400, f"body: invalid JSON ({exc})", field="body") from None
    if not isinstance(body, dict):
        raise HTTPProblem(400, f"body: expected a JSON object, got {type(body).__name__}", field="body")
    return body


async def routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route: 404; a route without that method: 405) in the
    gateway's one error shape, instead of Starlette's ``{"detail": ...}``."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "error"
    kind = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request_error")
    return error_response(
        status,
        f"{request.method} {request.url.path}: {detail}",
        kind=kind,
        headers=getattr(exc, "headers", None),
        anthropic=request.url.path.startswith("/v1/messages"),
    )
