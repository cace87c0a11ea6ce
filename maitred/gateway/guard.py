"""What every gateway endpoint checks before it does anything: the bearer token and the body size.

Errors are JSON ``{"error": {"message", "type", "field"}}`` with a 4xx status, the shape OpenAI
clients already print, naming what was wrong.
"""

import hmac
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response


class HTTPProblem(Exception):
    """Answer the request with ``status`` and a message naming ``field``."""

    def __init__(self, status: int, message: str, *, field: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.kind = status, message, field, kind

    def response(self) -> Response:
        return error_response(self.status, self.message, field=self.field, kind=self.kind)


def error_response(
    status: int,
    message: str,
    *,
    field: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> Response:
    body: dict[str, Any] = {"message": message, "type": kind}
    if field is not None:
        body["field"] = field
    return Response(orjson.dumps({"error": body}), status_code=status, media_type="application/json", headers=headers)


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
    client says its length, while reading it when it does not."""
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
