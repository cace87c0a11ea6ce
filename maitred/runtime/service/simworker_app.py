"""HTTP surface of the simulated SGLang worker (see ``simworker``): routes and response shapes.

Shapes follow SGLang 0.5.23: ``entrypoints/http_server.py`` (``/generate``, ``/health``,
``/server_info``, ``/model_info``, ``/v1/models``), ``entrypoints/v1_loads.py`` with
``managers/load_snapshot.py`` (``/v1/loads``), ``entrypoints/openai/protocol.py`` (chat and
completion responses, ``UsageInfo`` with ``prompt_tokens_details.cached_tokens`` as under
``--enable-cache-report``, ``ErrorResponse``) and ``observability/metrics_collector.py``
(metric names). Bad input gets 400 with SGLang's error body and a message naming the field.
"""

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from maitred.runtime.service.simworker import SimWorkerConfig
from maitred.runtime.service.simworker_engine import RealtimeEngine, Ticket
from maitred.runtime.service.simworker_metrics import loads_entry, metrics_text
from maitred.runtime.service.simworker_replies import Reply, chat_reply, text_reply
from maitred.runtime.service.simworker_tokens import Prompt, PromptError, render_chat, render_ids, render_text
from maitred.sim.engine import Worker
from maitred.sim.profile import EngineProfile

SGLANG_VERSION = "0.5.23"
DEFAULT_COMPLETION_TOKENS = 16     # SGLang's CompletionRequest.max_tokens default
DEFAULT_GENERATE_TOKENS = 128      # SGLang's SamplingParams.max_new_tokens default
CONTEXT_LENGTH = 131_072           # the bundled config.json's max_position_embeddings
NOTE = "maitred sim-worker: a simulated SGLang server for tests and demos; it is not a model and its text is filler."


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status, media_type="application/json")


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _openai_error(exc: BadRequest) -> Response:
    return _json({"object": "error", "message": str(exc), "type": "BadRequest", "param": exc.param, "code": 400}, 400)


def _generate_error(exc: BadRequest) -> Response:
    return _json({"error": {"message": str(exc), "type": "invalid_request_error", "param": exc.param, "code": 400}}, 400)


async def _json_object(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body: not valid JSON ({exc})", "body") from None
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object", "body")
    return body


def _int_field(body: Mapping[str, Any], name: str, minimum: int, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
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


class SimWorker:
    """One simulated worker: its engine, its capacity, and the replies it builds."""

    def __init__(self, config: SimWorkerConfig) -> None:
        self.config = config
        try:
            profile = EngineProfile.load(config.profile) if config.profile else EngineProfile()
        except ValueError as exc:
            raise ValueError(f"--profile: {exc}") from None
        self.profile = profile
        self.gpu_tokens = config.gpu_tokens or profile.gpu_kv_tokens
        self.cpu_tokens = config.cpu_tokens
        typed = config.radix_eviction_policy == "priority"
        worker = Worker("sim", profile, self.gpu_tokens, self.cpu_tokens, offload=self.cpu_tokens > 0, typed_eviction=typed)
        self.engine = RealtimeEngine(worker, config.time_scale, typed_eviction=typed)
        self.started = time.time()
        self.max_input = min(CONTEXT_LENGTH, self.gpu_tokens) - 1

    def check_fits(self, prompt: Prompt, output: int, field: str) -> None:
        if len(prompt.ids) + output > min(CONTEXT_LENGTH, self.gpu_tokens):
            raise BadRequest(
                f"{field}: {len(prompt.ids)} prompt tokens plus {output} to generate exceed this worker's "
                f"{min(CONTEXT_LENGTH, self.gpu_tokens)}-token limit (--gpu-tokens)", field)

    def submit(self, prompt: Prompt, reply: Reply, body: Mapping[str, Any], stream: bool) -> Ticket:
        """Queue a parsed request (``_priority`` was checked while parsing)."""
        return self.engine.submit(prompt, reply.output_ids, priority=body.get("priority"), stream=stream)


def _usage(ticket: Ticket) -> dict[str, Any]:
    r = ticket.request
    return {"prompt_tokens": r.context, "total_tokens": r.context + r.output, "completion_tokens": r.output,
            "prompt_tokens_details": {"cached_tokens": r.hit_tokens}, "reasoning_tokens": 0}


def _meta_info(rid: str, ticket: Ticket, finish: dict[str, Any] | None) -> dict[str, Any]:
    r = ticket.request
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": r.context, "weight_version": "default",
                            "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": ticket.generated,
                            "cached_tokens": r.hit_tokens}
    if r.hit_tokens:
        meta["cached_tokens_details"] = {"device": r.hit_tokens - r.host_hit_tokens, "host": r.host_hit_tokens}
    if finish is not None and r.done_at is not None:
        meta["e2e_latency"] = (r.done_at - r.arrival) / ticket.time_scale
    return meta


def _sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


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
            if generated > sent or (done and sent == 0):
                sent = generated
                yield sent
            if done:
                return
            await ticket.changed.wait()
    finally:
        if not ticket.done.is_set():
            engine.abort(ticket)


def _words_until(reply: Reply, generated: int) -> list[str]:
    return reply.words[:min(generated, len(reply.words))]


def build_app(config: SimWorkerConfig) -> FastAPI:
    sim = SimWorker(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sim.engine.start()
        try:
            yield
        finally:
            await sim.engine.stop()

    app = FastAPI(title="maitred sim-worker (simulated SGLang server)", description=NOTE, lifespan=lifespan)
    app.state.sim = sim
    name = config.served_model_name

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return server_info_body(sim)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": config.model_path, "served_model_name": name, "tokenizer_path": config.model_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default", "load_format": "dummy",
                "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
                "has_image_understanding": False, "has_audio_understanding": False, "model_type": "maitred_sim",
                "architectures": ["MaitredSimWorker"], "simulated": True, "note": NOTE}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(sim.started), "owned_by": "sglang",
                                            "root": name, "parent": None, "max_model_len": CONTEXT_LENGTH}]}

    @app.get("/v1/loads")
    async def loads(include: str | None = None, dp_rank: int | None = None) -> Response:
        sections = {s.strip() for s in include.split(",")} if include else None
        try:
            entry = loads_entry(sim, sections)
        except ValueError as exc:
            return _openai_error(BadRequest(str(exc), "include"))
        entries = [entry] if dp_rank in (None, 0) else []
        return _json({"timestamp": datetime.now(UTC).isoformat(), "version": SGLANG_VERSION,
                             "accelerator": "simulated", "num_accelerators": 1, "loads": entries})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(metrics_text(sim), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        try:
            body = await _json_object(request)
            prompt, reply, stream = _parse_generate(sim, body)
        except (BadRequest, PromptError) as exc:
            return _generate_error(exc if isinstance(exc, BadRequest) else BadRequest(str(exc), str(exc).split(":")[0]))
        ticket = sim.submit(prompt, reply, body, stream)
        rid = body["rid"] if isinstance(body.get("rid"), str) else uuid.uuid4().hex

        def out(generated: int, final: bool) -> dict[str, Any]:
            text_words = _words_until(reply, generated)
            finish = {"type": "length", "length": len(reply.output_ids)} if final else None
            return {"text": (" " + " ".join(text_words)) if text_words else "", "output_ids": reply.output_ids[:generated],
                    "meta_info": _meta_info(rid, ticket, finish)}

        if not stream:
            await ticket.done.wait()
            return _json(out(len(reply.output_ids), True))

        async def events() -> AsyncIterator[bytes]:
            async with aclosing(_progress(sim.engine, ticket)) as progress:
                async for generated in progress:
                    yield _sse(out(generated, ticket.done.is_set() and generated == len(reply.output_ids)))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            body = await _json_object(request)
            _check_single(body)
            prompt_field = body.get("prompt")
            if isinstance(prompt_field, list) and prompt_field and all(isinstance(i, int) for i in prompt_field):
                prompt = render_ids(prompt_field, "prompt")
            else:
                prompt = render_text(prompt_field, "prompt")
            max_tokens = _int_field(body, "max_tokens", 1, DEFAULT_COMPLETION_TOKENS)
            assert max_tokens is not None
            sim.check_fits(prompt, max_tokens, "max_tokens")
            reply = text_reply(prompt, max_tokens)
            stream = _stream_flag(body)
        except (BadRequest, PromptError) as exc:
            return _openai_error(exc if isinstance(exc, BadRequest) else BadRequest(str(exc), str(exc).split(":")[0]))
        ticket = sim.submit(prompt, reply, body, stream)
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if not stream:
            await ticket.done.wait()
            return _json({"id": cid, "object": "text_completion", "created": created, "model": name,
                                 "choices": [{"index": 0, "text": " " + reply.text, "logprobs": None,
                                              "finish_reason": reply.finish_reason, "matched_stop": None}],
                                 "usage": _usage(ticket)})

        async def events() -> AsyncIterator[bytes]:
            sent = 0
            async with aclosing(_progress(sim.engine, ticket)) as progress:
                async for generated in progress:
                    new = _words_until(reply, generated)[sent:]
                    sent += len(new)
                    done = ticket.done.is_set()
                    if new or done:
                        yield _sse({"id": cid, "object": "text_completion", "created": created, "model": name,
                                    "choices": [{"index": 0, "text": "".join(" " + w for w in new), "logprobs": None,
                                                 "finish_reason": reply.finish_reason if done else None, "matched_stop": None}]})
            if _include_usage(body):
                yield _sse({"id": cid, "object": "text_completion", "created": created, "model": name, "choices": [],
                            "usage": _usage(ticket)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = await _json_object(request)
            _check_single(body)
            prompt = render_chat(body.get("messages"), body.get("tools"))
            max_tokens = _int_field(body, "max_completion_tokens", 1, None) or _int_field(body, "max_tokens", 1, None)
            reply = chat_reply(body, prompt, max_tokens, script_tools=config.script_tools, script_steps=config.script_steps)
            sim.check_fits(prompt, len(reply.output_ids), "messages")
            stream = _stream_flag(body)
        except (BadRequest, PromptError) as exc:
            return _openai_error(exc if isinstance(exc, BadRequest) else BadRequest(str(exc), str(exc).split(":")[0]))
        ticket = sim.submit(prompt, reply, body, stream)
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if not stream:
            await ticket.done.wait()
            message: dict[str, Any] = {"role": "assistant", "content": None if reply.tool_calls else reply.text,
                                       "reasoning_content": None}
            if reply.tool_calls:
                message["tool_calls"] = reply.tool_calls
            return _json({"id": cid, "object": "chat.completion", "created": created, "model": name,
                                 "choices": [{"index": 0, "message": message, "logprobs": None,
                                              "finish_reason": reply.finish_reason, "matched_stop": None}],
                                 "usage": _usage(ticket), "metadata": {"weight_version": "default"}})

        def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
            return _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                         "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}]})

        async def events() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": ""}, None)
            sent = 0
            async with aclosing(_progress(sim.engine, ticket)) as progress:
                async for generated in progress:
                    new = _words_until(reply, generated)[sent:]
                    if new:
                        yield chunk({"content": ("" if sent == 0 else " ") + " ".join(new)}, None)
                        sent += len(new)
            if reply.tool_calls:
                yield chunk({"tool_calls": reply.tool_calls}, None)
            yield chunk({}, reply.finish_reason)
            if _include_usage(body):
                yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [],
                            "usage": _usage(ticket)})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _stream_flag(body: Mapping[str, Any]) -> bool:
    """``stream``, after checking the fields every generation endpoint shares."""
    _priority(body)
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
        max_new = _int_field(params, "max_new_tokens", 0, DEFAULT_GENERATE_TOKENS)
    except BadRequest as exc:
        raise BadRequest(f"sampling_params.{exc}", "sampling_params.max_new_tokens") from None
    assert max_new is not None
    sim.check_fits(prompt, max_new, "sampling_params.max_new_tokens")
    return prompt, text_reply(prompt, max_new), _stream_flag(body)


def server_info_body(sim: SimWorker) -> dict[str, Any]:
    """``/server_info``: the resolved server arguments SGLang reports, the scheduler's start-up
    info and one ``internal_states`` entry per data-parallel rank (here one)."""
    c = sim.config
    gpu, cpu = sim.gpu_tokens, sim.cpu_tokens
    kv_gb = round(gpu * sim.profile.kv_bytes_per_token / 1e9, 3)
    return {
        "model_path": c.model_path, "tokenizer_path": c.model_path, "served_model_name": c.served_model_name,
        "host": c.host, "port": c.port, "dp_size": 1, "tp_size": 1, "pp_size": 1, "page_size": 1,
        "context_length": CONTEXT_LENGTH, "max_running_requests": sim.profile.max_running,
        "chunked_prefill_size": sim.profile.prefill_chunk_tokens, "enable_metrics": True, "enable_cache_report": True,
        "enable_hierarchical_cache": cpu > 0, "hicache_ratio": (cpu / gpu) if cpu else None, "hicache_size": 0,
        "hicache_write_policy": "write_through", "radix_eviction_policy": c.radix_eviction_policy,
        "enable_priority_scheduling": False, "kv_events_config": None,
        "launch_command": f"maitred sim-worker --port {c.port} --gpu-tokens {gpu} --cpu-tokens {cpu} --time-scale {c.time_scale}",
        "status": "ready", "max_total_num_tokens": gpu, "max_req_input_len": sim.max_input, "startup_time": sim.started,
        "kv_events": None,
        "internal_states": [{
            "world_size": 1, "startup_time": sim.started,
            "effective_max_running_requests_per_dp": sim.profile.max_running, "last_gen_throughput": 0.0,
            "memory_usage": {"weight": 15.2, "kvcache": kv_gb, "startup_available": round(kv_gb + 15.2, 3),
                             "token_capacity": gpu, "token_capacity_swa": None, "graph": {}},
        }],
        "version": SGLANG_VERSION, "frontend": "python",
        "maitred_sim_worker": {"time_scale": c.time_scale, "host_tokens": cpu, "profile": sim.profile.name,
                               "script_tools": c.script_tools, "note": NOTE},
    }
