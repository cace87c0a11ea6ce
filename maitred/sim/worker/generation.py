"""The generation endpoints of the simulated SGLang worker: ``/generate``, ``/v1/completions``
and ``/v1/chat/completions``, streaming (SSE) or not, and ``/v1/tokenize``.

Shapes follow SGLang 0.5.23: ``entrypoints/http_server.py`` (``/generate``: ``text``,
``output_ids``, ``meta_info`` with ``cached_tokens`` and ``cached_tokens_details``; streamed
chunks carry the whole text so far, SGLang's default) and ``entrypoints/openai/protocol.py``
(chat and completion responses and chunks, ``UsageInfo`` with
``prompt_tokens_details.cached_tokens`` as under ``--enable-cache-report``, ``ErrorResponse``).
Bad input gets 400 with SGLang's error body for that endpoint and a message that starts with the
field's name; nothing reaches the engine until the whole request has been read.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from maitred.sim.worker.engine import EngineFailed, RealtimeEngine, Ticket
from maitred.sim.worker.replies import Reply, chat_reply, text_reply
from maitred.sim.worker.state import SimWorker
from maitred.sim.worker.tokens import Prompt, PromptError, render_chat, render_ids, render_text, tokenize

DEFAULT_COMPLETION_TOKENS = 16  # SGLang's CompletionRequest.max_tokens default
DEFAULT_GENERATE_TOKENS = 128  # SGLang's SamplingParams.max_new_tokens default
DONE = b"data: [DONE]\n\n"


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status, media_type="application/json")


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    @classmethod
    def of(cls, exc: Exception) -> "BadRequest":
        return exc if isinstance(exc, BadRequest) else cls(str(exc), str(exc).split(":")[0])


def openai_error(exc: BadRequest) -> Response:
    return json_response({"object": "error", "message": str(exc), "type": "BadRequest", "param": exc.param, "code": 400}, 400)


def _generate_error(exc: BadRequest) -> Response:
    return json_response({"error": {"message": str(exc), "type": "invalid_request_error", "param": exc.param, "code": 400}}, 400)


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body: not valid JSON ({exc})", "body") from None
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object", "body")
    return body


def _int_field(body: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{name}: expected an integer >= {minimum}, got {value!r}", name)
    return value


def _priority(body: Mapping[str, Any]) -> int | None:
    value = body.get("priority")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise BadRequest(f"priority: expected an integer, got {value!r}", "priority")
    return value


def _check_single(body: Mapping[str, Any]) -> None:
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest(f"n: the simulated worker answers one choice per request, got {n!r}", "n")


def _check_fits(sim: SimWorker, prompt: Prompt, output: int, field: str) -> None:
    limit = sim.max_input + 1
    if len(prompt.ids) + output > limit:
        raise BadRequest(
            f"{field}: {len(prompt.ids)} prompt tokens plus {output} to generate exceed this worker's "
            f"{limit}-token limit (--gpu-tokens)",
            field,
        )


def _stream_flag(body: Mapping[str, Any]) -> bool:
    """``stream``, after checking the fields every generation endpoint shares."""
    _priority(body)
    session = body.get("session_id")
    if session is not None and not isinstance(session, str):
        raise BadRequest(f"session_id: expected a string, got {session!r}", "session_id")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream: expected true or false, got {stream!r}", "stream")
    return stream


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


def _parse_generate(sim: SimWorker, body: dict[str, Any]) -> tuple[Prompt, Reply, bool]:
    if body.get("input_ids") is not None:
        prompt = render_ids(body["input_ids"])
    elif body.get("text") is not None:
        prompt = render_text(body["text"], "text")
    else:
        raise BadRequest("text: give text or input_ids", "text")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params: expected an object", "sampling_params")
    try:
        max_new = _int_field(params, "max_new_tokens", 0)
    except BadRequest as exc:
        raise BadRequest(f"sampling_params.{exc}", "sampling_params.max_new_tokens") from None
    if max_new is None:
        max_new = DEFAULT_GENERATE_TOKENS
    _check_fits(sim, prompt, max_new, "sampling_params.max_new_tokens")
    return prompt, text_reply(prompt, max_new), _stream_flag(body)


def _usage(ticket: Ticket) -> dict[str, Any]:
    r = ticket.request
    return {
        "prompt_tokens": r.context,
        "total_tokens": r.context + r.output,
        "completion_tokens": r.output,
        "prompt_tokens_details": {"cached_tokens": r.hit_tokens},
        "reasoning_tokens": 0,
    }


def _meta_info(rid: str, ticket: Ticket, finish: dict[str, Any] | None) -> dict[str, Any]:
    r = ticket.request
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": r.context,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": ticket.generated,
        "cached_tokens": r.hit_tokens,
    }
    if r.hit_tokens:
        meta["cached_tokens_details"] = {"device": r.hit_tokens - r.host_hit_tokens, "host": r.host_hit_tokens}
    if finish is not None and r.done_at is not None:
        meta["e2e_latency"] = (r.done_at - r.arrival) / ticket.time_scale
    return meta


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def named_sse(event: str, payload: Any) -> bytes:
    """An event with its name, as Anthropic's and the Responses API's streams send each one."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


async def _progress(engine: RealtimeEngine, ticket: Ticket) -> AsyncGenerator[int, None]:
    """Yields the number of output tokens generated so far each time it grows (once, at the end,
    for a request with no output), until the request is done. A stream closed early (the client
    disconnected) aborts the request."""
    sent = 0
    try:
        while True:
            ticket.changed.clear()  # before reading: a change while the consumer holds a value is not lost
            done = ticket.done.is_set()
            generated = ticket.generated
            if engine.failure is not None:
                raise EngineFailed(engine.failure)
            if generated > sent or (done and sent == 0):
                sent = generated
                yield sent
            if done:
                return
            await ticket.changed.wait()
    finally:
        if not ticket.done.is_set():
            engine.abort(ticket)


async def _guarded(
    sim: SimWorker, chunks: AsyncGenerator[bytes, None], failed: Callable[[str], bytes] | None = None
) -> AsyncGenerator[bytes, None]:
    """A stream whose engine fails ends with SGLang's error event (``failed`` makes it from the
    failure's message, for APIs whose streams end otherwise), not a cut connection."""
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield chunk
        except EngineFailed:
            if failed is not None:
                yield failed(str(sim.engine.failure))
            else:
                yield _sse(_failure(sim))
                yield DONE


def _words_until(reply: Reply, generated: int) -> list[str]:
    return reply.words[: min(generated, len(reply.words))]


def _submit(sim: SimWorker, prompt: Prompt, reply: Reply, body: Mapping[str, Any], stream: bool) -> Ticket:
    """Queue a parsed request (its ``priority`` and ``session_id`` were checked while parsing)."""
    return sim.engine.submit(
        prompt, reply.output_ids, priority=body.get("priority"), stream=stream, session_id=body.get("session_id")
    )


def _failure(sim: SimWorker) -> dict[str, Any]:
    """SGLang's error body for a request the server could not serve."""
    return {"error": {"message": sim.engine.failure, "type": "internal_error", "code": 500}}


class _Refused(Exception):
    """A request answered before generation: bad input, or an engine that has failed."""

    def __init__(self, response: Response) -> None:
        self.response = response


Parse = Callable[[SimWorker, dict[str, Any]], tuple[Prompt, Reply, bool]]


async def _start(
    request: Request,
    parse: Parse,
    error: Callable[[BadRequest], Response],
) -> tuple[SimWorker, dict[str, Any], Reply, bool, Ticket]:
    """Read, check and queue a generation request, the same for every endpoint but for its
    parser and its error body."""
    sim: SimWorker = request.app.state.sim
    traceparent = request.headers.get("traceparent")
    if traceparent is not None:
        sim.trace_contexts.append((request.url.path, traceparent))
    try:
        body = await _json_object(request)
        prompt, reply, stream = parse(sim, body)
    except (BadRequest, PromptError) as exc:
        raise _Refused(error(BadRequest.of(exc))) from None
    try:
        ticket = _submit(sim, prompt, reply, body, stream)
    except EngineFailed:
        raise _Refused(json_response(_failure(sim), 500)) from None
    return sim, body, reply, stream, ticket


async def _finished(sim: SimWorker, ticket: Ticket, request: Request) -> None:
    """Wait for a whole (non-streamed) answer; an engine failure meanwhile is a 500. Like SGLang's
    tokenizer manager (``_wait_one_response``), it looks every ``abort_check_s`` whether the
    client is still connected, and aborts the request when it is not: a client (or a gateway)
    that closes its connection stops the generation."""
    while True:
        try:
            await asyncio.wait_for(ticket.done.wait(), sim.config.abort_check_s)
            break
        except TimeoutError:
            if await request.is_disconnected():
                sim.engine.abort(ticket)
                message = "Request is disconnected from the client side. Abort request"
                raise _Refused(json_response({"error": {"message": message, "type": "aborted", "code": 499}}, 499)) from None
    if sim.engine.failure is not None:
        raise _Refused(json_response(_failure(sim), 500))


# -- /generate -------------------------------------------------------------------------------


async def generate(request: Request) -> Response:
    try:
        sim, body, reply, stream, ticket = await _start(request, _parse_generate, _generate_error)
    except _Refused as refused:
        return refused.response
    rid = body["rid"] if isinstance(body.get("rid"), str) else uuid.uuid4().hex

    def out(generated: int, final: bool) -> dict[str, Any]:
        text_words = _words_until(reply, generated)
        finish = {"type": "length", "length": len(reply.output_ids)} if final else None
        return {
            "text": (" " + " ".join(text_words)) if text_words else "",
            "output_ids": reply.output_ids[:generated],
            "meta_info": _meta_info(rid, ticket, finish),
        }

    if not stream:
        try:
            await _finished(sim, ticket, request)
        except _Refused as refused:
            return refused.response
        return json_response(out(len(reply.output_ids), True))

    async def events() -> AsyncGenerator[bytes, None]:
        async with aclosing(_progress(sim.engine, ticket)) as progress:
            async for generated in progress:
                yield _sse(out(generated, ticket.done.is_set() and generated == len(reply.output_ids)))
        yield DONE

    return StreamingResponse(_guarded(sim, events()), media_type="text/event-stream")


# -- /v1/completions -------------------------------------------------------------------------


def _parse_completion(sim: SimWorker, body: dict[str, Any]) -> tuple[Prompt, Reply, bool]:
    _check_single(body)
    field = body.get("prompt")
    if isinstance(field, list) and field and all(isinstance(i, int) for i in field):
        prompt = render_ids(field, "prompt")
    else:
        prompt = render_text(field, "prompt")
    max_tokens = _int_field(body, "max_tokens", 1) or DEFAULT_COMPLETION_TOKENS
    _check_fits(sim, prompt, max_tokens, "max_tokens")
    return prompt, text_reply(prompt, max_tokens), _stream_flag(body)


async def completions(request: Request) -> Response:
    try:
        sim, body, reply, stream, ticket = await _start(request, _parse_completion, openai_error)
    except _Refused as refused:
        return refused.response
    head = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": sim.config.served_model_name,
    }
    if not stream:
        try:
            await _finished(sim, ticket, request)
        except _Refused as refused:
            return refused.response
        choice = {
            "index": 0,
            "text": " " + reply.text,
            "logprobs": None,
            "finish_reason": reply.finish_reason,
            "matched_stop": None,
        }
        return json_response({**head, "choices": [choice], "usage": _usage(ticket)})

    async def events() -> AsyncGenerator[bytes, None]:
        sent = 0
        async with aclosing(_progress(sim.engine, ticket)) as progress:
            async for generated in progress:
                new = _words_until(reply, generated)[sent:]
                sent += len(new)
                done = ticket.done.is_set()
                if new or done:
                    yield _sse(
                        {
                            **head,
                            "choices": [
                                {
                                    "index": 0,
                                    "text": "".join(" " + w for w in new),
                                    "logprobs": None,
                                    "finish_reason": reply.finish_reason if done else None,
                                    "matched_stop": None,
                                }
                            ],
                        }
                    )
        if _include_usage(body):
            yield _sse({**head, "choices": [], "usage": _usage(ticket)})
        yield DONE

    return StreamingResponse(_guarded(sim, events()), media_type="text/event-stream")


# -- /v1/chat/completions --------------------------------------------------------------------


def _parse_chat(sim: SimWorker, body: dict[str, Any]) -> tuple[Prompt, Reply, bool]:
    _check_single(body)
    prompt = render_chat(body.get("messages"), body.get("tools"))
    max_tokens = _int_field(body, "max_completion_tokens", 1) or _int_field(body, "max_tokens", 1)
    config = sim.config
    reply = chat_reply(
        body, prompt, max_tokens, script_tools=config.script_tools, script_steps=config.script_steps, script=config.script
    )
    _check_fits(sim, prompt, len(reply.output_ids), "messages")
    return prompt, reply, _stream_flag(body)


async def chat(request: Request) -> Response:
    try:
        sim, body, reply, stream, ticket = await _start(request, _parse_chat, openai_error)
    except _Refused as refused:
        return refused.response
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": sim.config.served_model_name}
    if not stream:
        try:
            await _finished(sim, ticket, request)
        except _Refused as refused:
            return refused.response
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if reply.tool_calls else reply.text,
            "reasoning_content": None,
        }
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason, "matched_stop": None}
        return json_response(
            {
                **head,
                "object": "chat.completion",
                "choices": [choice],
                "usage": _usage(ticket),
                "metadata": {"weight_version": "default"},
            }
        )
    return StreamingResponse(_guarded(sim, _chat_events(sim, ticket, reply, body, head)), media_type="text/event-stream")


async def _chat_events(
    sim: SimWorker, ticket: Ticket, reply: Reply, body: Mapping[str, Any], head: dict[str, Any]
) -> AsyncGenerator[bytes, None]:
    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        return _sse(
            {
                **head,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
            }
        )

    yield chunk({"role": "assistant", "content": ""}, None)
    sent = 0
    async with aclosing(_progress(sim.engine, ticket)) as progress:
        async for generated in progress:
            new = _words_until(reply, generated)[sent:]
            if new:
                yield chunk({"content": ("" if sent == 0 else " ") + " ".join(new)}, None)
                sent += len(new)
    for call in reply.tool_calls or []:  # as SGLang streams them: id and name first, then the arguments
        function = call["function"]
        yield chunk({"tool_calls": [{**call, "function": {"name": function["name"], "arguments": ""}}]}, None)
        yield chunk(
            {
                "tool_calls": [
                    {
                        "id": None,
                        "index": call["index"],
                        "type": "function",
                        "function": {"name": None, "arguments": function["arguments"]},
                    }
                ]
            },
            None,
        )
    yield chunk({}, reply.finish_reason)
    if _include_usage(body):
        yield _sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(ticket)})
    yield DONE


# -- /v1/tokenize ----------------------------------------------------------------------------


async def tokenize_request(request: Request) -> Response:
    """SGLang's ``/v1/tokenize``: ``prompt`` (a string or a list of them) or ``messages`` (with
    ``tools``) rendered as for a chat completion, or without the generation prompt when
    ``add_generation_prompt`` is false. This is how a client warms a chat prefix: tokenize the
    messages, then ``/generate`` them as ``input_ids`` with ``max_new_tokens: 0``."""
    sim: SimWorker = request.app.state.sim
    try:
        body = await _json_object(request)
        tokens, count = _tokenize_body(body)
    except (BadRequest, PromptError) as exc:
        return openai_error(BadRequest.of(exc))
    return json_response({"tokens": tokens, "count": count, "max_model_len": sim.max_input + 1})


def _tokenize_body(body: dict[str, Any]) -> tuple[Any, Any]:
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise BadRequest("prompt: give exactly one of 'prompt' or 'messages'", "prompt")
    if messages is not None:
        generation = body.get("add_generation_prompt")
        if generation is not None and not isinstance(generation, bool):
            raise BadRequest(f"add_generation_prompt: expected true or false, got {generation!r}", "add_generation_prompt")
        ids = render_chat(messages, body.get("tools"), generation_prompt=generation is not False).ids
        return ids, len(ids)
    if isinstance(prompt, str):
        ids = tokenize(prompt)
        return ids, len(ids)
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        lists = [tokenize(p) for p in prompt]
        return lists, [len(ids) for ids in lists]
    raise BadRequest("prompt: expected a string or a list of strings", "prompt")
