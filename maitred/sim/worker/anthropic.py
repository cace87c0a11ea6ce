"""The simulated worker's Anthropic endpoints: ``/v1/messages`` (streaming or not) and
``/v1/messages/count_tokens``, in the shapes of SGLang's ``entrypoints/anthropic/``.

A request is served as the chat request SGLang would make of it (``dialects``), so its prompt,
its cache hits and its ``--script-tools`` tool calls are the chat endpoint's; the answer is
Anthropic's: ``content`` blocks (``text``, or ``tool_use`` with the call's ``input``), a
``stop_reason`` (``end_turn``, ``max_tokens``, ``tool_use``) and ``usage`` as SGLang gives it
(``input_tokens`` the whole prompt, ``cache_read_input_tokens`` its cached part). A stream is
Anthropic's event sequence: ``message_start``, then per block ``content_block_start``,
``content_block_delta`` (``text_delta`` / ``input_json_delta``) and ``content_block_stop``, then
``message_delta`` (stop reason and usage) and ``message_stop``. Errors are Anthropic's
``{"type": "error", "error": {"type", "message"}}``.
"""

import json
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from maitred.sim.worker.dialects import anthropic_to_chat
from maitred.sim.worker.engine import Ticket
from maitred.sim.worker.generation import (
    BadRequest,
    _finished,
    _guarded,
    _json_object,
    _parse_chat,
    _progress,
    _Refused,
    _start,
    _words_until,
    json_response,
    named_sse,
)
from maitred.sim.worker.replies import Reply
from maitred.sim.worker.state import SimWorker
from maitred.sim.worker.tokens import Prompt, PromptError, render_chat

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_error(exc: BadRequest) -> Response:
    return json_response({"type": "error", "error": {"type": "invalid_request_error", "message": str(exc)}}, 400)


def _failed(message: str) -> bytes:
    return named_sse("error", {"type": "error", "error": {"type": "api_error", "message": message}})


def _parse(sim: SimWorker, body: dict[str, Any]) -> tuple[Prompt, Reply, bool]:
    return _parse_chat(sim, anthropic_to_chat(body))


def _usage(ticket: Ticket) -> dict[str, int]:
    r = ticket.request
    return {"input_tokens": r.context, "output_tokens": r.output, "cache_read_input_tokens": r.hit_tokens}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": json.loads(function["arguments"])}


async def messages(request: Request) -> Response:
    try:
        sim, body, reply, stream, ticket = await _start(request, _parse, anthropic_error)
    except _Refused as refused:
        return refused.response
    model = body["model"] if isinstance(body.get("model"), str) else sim.config.served_model_name
    head = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model}
    if stream:
        return StreamingResponse(_guarded(sim, _events(sim, ticket, reply, head), _failed), media_type="text/event-stream")
    try:
        await _finished(sim, ticket, request)
    except _Refused as refused:
        return refused.response
    content = [{"type": "text", "text": reply.text}] if reply.words or not reply.tool_calls else []
    content += [_tool_use(call) for call in reply.tool_calls or []]
    stop = {"stop_reason": STOP_REASONS[reply.finish_reason], "stop_sequence": None}
    return json_response({**head, "content": content, **stop, "usage": _usage(ticket)})


async def _events(sim: SimWorker, ticket: Ticket, reply: Reply, head: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    start = {"input_tokens": ticket.request.context, "output_tokens": 0}
    message = {**head, "content": [], "stop_reason": None, "stop_sequence": None, "usage": start}
    yield named_sse("message_start", {"type": "message_start", "message": message})
    index, sent = 0, 0
    async with aclosing(_progress(sim.engine, ticket)) as progress:
        async for generated in progress:
            new = _words_until(reply, generated)[sent:]
            if not new:
                continue
            if sent == 0:
                block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
                yield named_sse("content_block_start", block)
            text = ("" if sent == 0 else " ") + " ".join(new)
            yield named_sse(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
            )
            sent += len(new)
    if sent:
        yield named_sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    for call in reply.tool_calls or []:
        block = {**_tool_use(call), "input": {}}
        yield named_sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        delta = {"type": "input_json_delta", "partial_json": call["function"]["arguments"]}
        yield named_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield named_sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    delta = {"stop_reason": STOP_REASONS[reply.finish_reason], "stop_sequence": None}
    yield named_sse("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(ticket)})
    yield named_sse("message_stop", {"type": "message_stop"})


async def count_tokens(request: Request) -> Response:
    """``input_tokens``: the prompt the request would render, as SGLang counts it (its chat
    template over the converted messages and tools)."""
    try:
        chat = anthropic_to_chat(await _json_object(request), counting=True)
        ids = render_chat(chat["messages"], chat.get("tools")).ids
    except (BadRequest, PromptError) as exc:
        return anthropic_error(BadRequest.of(exc))
    return json_response({"input_tokens": len(ids)})


__all__ = ["count_tokens", "messages"]
