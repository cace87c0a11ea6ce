"""One model request through the component: admission, the pinned call, usage back to the core.

Dynamo's frontend tokenizes the client's request and hands the component a
``PreprocessedRequest`` dict (``token_ids``, ``stop_conditions``, ``routing``,
``agent_context``, ...). The program is ``agent_context.session_id``, which the frontend fills
from the ``x-dynamo-session-id`` header (or ``x-session-id``, ``x-claude-code-session-id``);
a request without one is a one-step program, as in ``maitred serve``. Dynamo's frontend
forwards no other header and refuses unknown body fields, so maitred's ``X-Program-Id`` and
body ``program_id`` do not reach a component; clients of a Dynamo frontend name their program
with ``x-dynamo-session-id``. A request with ``x-dynamo-session-final`` ends the program
(``program.end``) and is not sent to a worker, as ``dynamo.thunderagent_router`` does.

Each turn waits in ``LiveDriver.admit`` until the core admits it (held while its program does
not fit, then forced after the bounded wait), and goes to the worker the core chose through
Dynamo's routing field ``routing.backend_instance_id`` (the KV router sends a pinned request
there and still books it in its load and KV accounting). The usage in the stream's last
chunk (``completion_usage``: prompt, completion and cached tokens) goes back to the core as
the step's ``llm.end``.
"""

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from maitred.events import ProgramEnd
from maitred.gateway.loop import LiveDriver

log = logging.getLogger("maitred.service")
#: Program ids given to requests that name none (forgotten once answered).
ANONYMOUS_PREFIX = "dynamo-anonymous-"
#: What of the frontend's request goes on to the KV router (``PreprocessedRequest``'s fields).
FORWARDED = (
    "model",
    "token_ids",
    "stop_conditions",
    "sampling_options",
    "output_options",
    "eos_token_ids",
    "annotations",
    "routing",
    "router_config_override",
    "prefill_result",
    "bootstrap_info",
    "extra_args",
    "mm_processor_kwargs",
    "agent_context",
    "request_timestamp_ms",
)


def session_of(request: dict[str, Any]) -> tuple[str | None, bool]:
    """``(program id, session final)`` from the request's ``agent_context``."""
    ctx = request.get("agent_context")
    if not isinstance(ctx, dict):
        return None, False
    sid = ctx.get("session_id")
    return (sid if isinstance(sid, str) and sid else None), bool(ctx.get("session_final"))


def forwarded(request: dict[str, Any], instance_id: int, priority: int | None) -> dict[str, Any]:
    """The request for the KV router, pinned to ``instance_id``. ``priority`` (the core's
    encoding for SGLang's ``--radix-eviction-policy priority``) goes in ``routing.priority``,
    which Dynamo's SGLang worker passes to SGLang as the request's priority."""
    out = {name: request.get(name) for name in FORWARDED if name in request}
    out.setdefault("model", "unknown")
    routing = dict(request.get("routing") or {})
    routing["backend_instance_id"] = instance_id
    if priority is not None:
        routing["priority"] = priority
    out["routing"] = routing
    return out


def wants_engine_data(request: dict[str, Any]) -> bool:
    """The client asked for ``nvext.extra_fields: ["engine_data"]`` (raw or preprocessed request)."""
    extra_args = request.get("extra_args")
    for source in (request.get("nvext"), extra_args.get("nvext") if isinstance(extra_args, dict) else None):
        if isinstance(source, dict) and "engine_data" in (source.get("extra_fields") or ()):
            return True
    return False


def served_by(chunk: Any) -> int | None:
    """The instance that served ``chunk``, as the KV router reports it (``routing_data.worker_id``)."""
    routing = chunk.get("routing_data") if isinstance(chunk, dict) else None
    info = routing.get("worker_id") if isinstance(routing, dict) else None
    worker = info.get("decode_worker_id") if isinstance(info, dict) else None
    return worker if isinstance(worker, int) else None


def with_proof(chunk: Any, proof: dict[str, Any]) -> Any:
    """``chunk`` with what the component decided under ``engine_data.maitred``: the program, the
    instance the core chose, the one the KV router reports serving it, the admission's wait and
    the ``routing.priority`` sent (None without ``--priority``)
    (the frontend's own ``nvext.worker_id`` names the instance it sent the request to: this
    component)."""
    if isinstance(chunk, dict):
        engine_data = chunk.get("engine_data")
        engine_data = dict(engine_data) if isinstance(engine_data, dict) else {}
        engine_data["maitred"] = proof
        chunk["engine_data"] = engine_data
    return chunk


class Usage:
    """What the stream said of the request: first token, tokens, and whether it finished."""

    def __init__(self, estimated_prompt: int) -> None:
        self.started = time.perf_counter()
        self.ttft_s: float | None = None
        self.prompt_tokens = estimated_prompt
        self.reported_prompt = False
        self.completion_tokens = 0
        self.cached_tokens: int | None = None
        self.finish_reason: str | None = None

    def see(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        tokens = chunk.get("token_ids")
        if isinstance(tokens, list) and tokens:
            if self.ttft_s is None:
                self.ttft_s = time.perf_counter() - self.started
            self.completion_tokens += len(tokens)
        usage = chunk.get("completion_usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens, self.reported_prompt = usage["prompt_tokens"], True
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.cached_tokens = details["cached_tokens"]
            if chunk.get("finish_reason") and isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
        if chunk.get("finish_reason"):
            self.finish_reason = str(chunk["finish_reason"])

    @property
    def ok(self) -> bool:
        return self.finish_reason is not None and self.finish_reason != "error"


class MaitredHandler:
    """The component's ``generate`` endpoint. ``router``: Dynamo's ``KvRouter`` on the worker
    endpoint; ``instance_ids``: the instances serving it now (to tell a worker that went away
    from a request that failed for another reason)."""

    def __init__(self, driver: LiveDriver, router: Any, *, priority: bool, instance_ids: Any) -> None:
        self.driver, self.router, self.priority, self.instance_ids = driver, router, priority, instance_ids
        self.requests = self.program_requests = self.session_final = 0

    async def generate(self, request: dict[str, Any], context: Any = None) -> AsyncIterator[Any]:
        driver = self.driver
        self.requests += 1
        program_id, final = session_of(request)
        if program_id is not None and final:
            self.session_final += 1
            driver.ingest([ProgramEnd(ts=driver.clock(), program_id=program_id)])
            return
        anonymous = program_id is None
        if program_id is None:
            program_id = ANONYMOUS_PREFIX + uuid.uuid4().hex
        else:
            self.program_requests += 1
        tokens = request.get("token_ids") or []
        request_id = driver.new_request_id()
        admission = await driver.admit(
            program_id,
            request_id=request_id,
            agent=None,
            model=request.get("model"),
            prompt_tokens=len(tokens),
            store=not anonymous,
        )
        worker = admission.worker
        priority = driver.priority_for(program_id, worker) if self.priority else None
        usage = Usage(len(tokens))
        proof = None
        if wants_engine_data(request):
            proof = {
                "program_id": program_id,
                "worker_id": int(worker),
                "waited_s": admission.waited_s,
                "forced": admission.forced,
                "priority": priority,
            }
        driver.inflight[worker] += 1
        try:
            async for chunk in await self.router.generate_from_request(forwarded(request, int(worker), priority)):
                usage.see(chunk)
                if proof is not None and "served_by" not in proof:
                    served = served_by(chunk)
                    if served is not None:
                        proof["served_by"] = served
                yield chunk if proof is None else with_proof(chunk, proof)
        except Exception as exc:
            if int(worker) not in self.instance_ids():
                driver.worker_failed(worker, reason=type(exc).__name__)
            raise
        finally:
            driver.inflight[worker] -= 1
            driver.completed(
                program_id,
                request_id=request_id,
                worker=worker,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                cached_tokens=usage.cached_tokens,
                ttft_s=usage.ttft_s,
                ok=usage.ok,
                store=not anonymous,
            )
            if anonymous:
                driver.end_anonymous(program_id)

    def status(self) -> dict[str, Any]:
        return {
            "component": "maitred",
            "requests": {"total": self.requests, "program": self.program_requests, "session_final": self.session_final},
            "held": self.driver.held_count(),
            "workers": {w: {"healthy": s.healthy, "gpu_tokens": s.gpu_tokens} for w, s in self.driver.state.workers.items()},
        }
