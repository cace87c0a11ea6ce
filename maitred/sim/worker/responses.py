"""The simulated worker's ``/v1/responses`` (OpenAI's Responses API, which Codex CLI speaks),
streaming or not, in the shapes of SGLang's ``entrypoints/openai/serving_responses.py``.

A request is served as the chat request it maps to (``dialects``), so prompts, cache hits and
``--script-tools`` calls are the chat endpoint's. The answer's ``output`` holds one ``message``
item (an ``output_text`` part) or the ``function_call`` items of a scripted tool call; ``usage``
is ``input_tokens`` (with ``input_tokens_details.cached_tokens``) and ``output_tokens``. A stream
is the API's named events, each with its ``sequence_number``: ``response.created``, the output
item's ``added`` / deltas / ``done`` events, then ``response.completed`` carrying the whole
response. Errors are SGLang's OpenAI error body.
"""

import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from maitred.sim.worker.dialects import responses_to_chat
from maitred.sim.worker.engine import Ticket
from maitred.sim.worker.generation import (
    _finished,
    _guarded,
    _parse_chat,
    _progress,
    _Refused,
    _start,
    _words_until,
    json_response,
    named_sse,
    openai_error,
)
from maitred.sim.worker.replies import Reply
from maitred.sim.worker.state import SimWorker
from maitred.sim.worker.tokens import Prompt


def _parse(sim: SimWorker, body: dict[str, Any]) -> tuple[Prompt, Reply, bool]:
    return _parse_chat(sim, responses_to_chat(body))


def _usage(ticket: Ticket) -> dict[str, Any]:
    r = ticket.request
    return {
        "input_tokens": r.context,
        "input_tokens_details": {"cached_tokens": r.hit_tokens},
        "output_tokens": r.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": r.context + r.output,
    }


class _Answer:
    """One response's ids and items, built the same way for the whole answer and the stream."""

    def __init__(self, sim: SimWorker, body: dict[str, Any], reply: Reply) -> None:
        self.reply = reply
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.head = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": body["model"] if isinstance(body.get("model"), str) else sim.config.served_model_name,
            "error": None,
        }

    def items(self) -> list[dict[str, Any]]:
        if self.reply.tool_calls:
            return [self.function_call(call) for call in self.reply.tool_calls]
        part = {"type": "output_text", "text": self.reply.text, "annotations": []}
        return [{"type": "message", "id": self.message_id, "status": "completed", "role": "assistant", "content": [part]}]

    @staticmethod
    def function_call(call: dict[str, Any], arguments: str | None = None) -> dict[str, Any]:
        function = call["function"]
        return {
            "type": "function_call",
            "id": f"fc_{call['id']}",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"] if arguments is None else arguments,
            "status": "completed" if arguments is None else "in_progress",
        }

    def response(self, ticket: Ticket | None) -> dict[str, Any]:
        """The whole response once ``ticket`` is done (None: as it starts, with nothing out yet)."""
        if ticket is None:
            return {**self.head, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        truncated = self.reply.finish_reason == "length"
        return {
            **self.head,
            "status": "incomplete" if truncated else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "output": self.items(),
            "usage": _usage(ticket),
        }


async def responses(request: Request) -> Response:
    try:
        sim, body, reply, stream, ticket = await _start(request, _parse, openai_error)
    except _Refused as refused:
        return refused.response
    answer = _Answer(sim, body, reply)
    if stream:
        return StreamingResponse(_guarded(sim, _events(sim, ticket, answer), _failed), media_type="text/event-stream")
    try:
        await _finished(sim, ticket, request)
    except _Refused as refused:
        return refused.response
    return json_response(answer.response(ticket))


def _failed(message: str) -> bytes:
    return named_sse("error", {"type": "error", "code": "internal_error", "message": message})


async def _events(sim: SimWorker, ticket: Ticket, answer: _Answer) -> AsyncGenerator[bytes, None]:
    numbers: Iterator[int] = iter(range(1 << 62))

    def event(kind: str, **fields: Any) -> bytes:
        return named_sse(kind, {"type": kind, "sequence_number": next(numbers), **fields})

    yield event("response.created", response=answer.response(None))
    reply, item_id = answer.reply, answer.message_id
    texts: list[str] = []
    if not reply.tool_calls:
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
        yield event("response.output_item.added", output_index=0, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        yield event("response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part)
    async with aclosing(_progress(sim.engine, ticket)) as progress:
        async for generated in progress:
            new = _words_until(reply, generated)[len(texts) :]
            if new:
                delta = ("" if not texts else " ") + " ".join(new)
                texts += new
                yield event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=delta)
    for index, done in enumerate(answer.items()):
        if done["type"] == "message":
            text = done["content"][0]["text"]
            yield event("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=text)
            yield event("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=done["content"][0])
        else:
            call = reply.tool_calls[index] if reply.tool_calls else {}
            yield event("response.output_item.added", output_index=index, item=answer.function_call(call, ""))
            arguments = done["arguments"]
            yield event("response.function_call_arguments.delta", item_id=done["id"], output_index=index, delta=arguments)
            yield event("response.function_call_arguments.done", item_id=done["id"], output_index=index, arguments=arguments)
        yield event("response.output_item.done", output_index=index, item=done)
    yield event("response.completed", response=answer.response(ticket))
