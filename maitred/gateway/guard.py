"""What every gateway endpoint checks before it does anything: the bearer token and the body size.

Errors are JSON ``{"error": {"message", "type", "field"}}`` with a 4xx status, the shape OpenAI
clients already print, naming what was wrong. On Anthropic's routes (``/v1/messages``) they take
Anthropic's shape instead, ``{"type": "error", "error": {"type", "message"}}``, which the
Anthropic SDKs (and Claude Code) parse and print; the message still names the field.
"""

import hmac
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


def check_token(request: Request, token: str | None) -> None:
    """Ingest and admin endpoints need ``Authorization: Bearer <token>`` when a token is set
    (compared in constant time)."""
    if token is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise HTTPProblem(
            401,
            "missing or wrong bearer token (Authorization: Bearer <MAITRED_TOKEN>)",
            field="authorization",
            kind="authentication_error",
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes — before reading it when the
    client says its length, while reading it when it does not. A client that leaves before the
    end (or is cut off by ``--body-timeout``) is answered 499, which nobody reads, instead of
    being reported as a server error."""
    try:
        return await _read_body(request, limit)
    except ClientDisconnect:
        raise HTTPProblem(499, "the client left before sending the whole body", field="body", kind="client_gone") from None


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
