"""Ingest and introspection endpoints: events in, programs, tool statistics and metrics out.

``POST /v1/events`` takes a JSON array or NDJSON (``maitred.events.loads_batch``): good events
go into the live state and the store, bad ones are answered by index with the field and
reason; the answer is 4xx only when nothing in the batch was valid. ``POST
/v1/hooks/claude-code`` takes a Claude Code hook payload as Claude Code posts it. ``POST
/v1/admit`` is the gateway's admission for requests that reach the workers another way (the
LiteLLM callback): it answers once the program may run, with its worker. Ingest and
admin endpoints take the bearer token when one is set; ``/metrics`` and ``/healthz`` stay open
for scrapers and load balancers (they name no programs).
"""

import asyncio
import importlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from maitred.events import Event, EventError, LLMStart, decode_event, loads_batch
from maitred.gateway.guard import HTTPProblem, check_token, parse_json_object, read_body
from maitred.gateway.loop import LiveDriver, NoWorkerAvailable
from maitred.gateway.metrics import CONTENT_TYPE
from maitred.runtime.history import DurationStats

HookMapper = Callable[[Mapping[str, Any], float], list[Event]]
#: What ``POST /v1/admit`` takes: the program, and what is known of the request about to run.
ADMIT_FIELDS = frozenset({"program_id", "request_id", "agent", "model", "prompt_tokens"})


def claude_code_mapper() -> tuple[HookMapper | None, type[Exception]]:
    """``maitred.integrations.claude_code.to_events`` and its payload error, when installed."""
    try:
        module = importlib.import_module("maitred.integrations.claude_code")
    except ImportError:
        return None, ValueError
    return getattr(module, "to_events", None), getattr(module, "HookPayloadError", ValueError)


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _hook_answer(status: int, *, accepted: int, mapped: bool) -> Response:
    return Response(b"{}", status_code=status, media_type="application/json",
                    headers={"x-maitred-accepted": str(accepted), "x-maitred-mapped": "true" if mapped else "false"})


def _stats(name: str, s: DurationStats) -> dict[str, Any]:
    return {"tool": name, "n": s.n, "mean_s": s.mean, "std_s": s.std, "min_s": s.lo if s.n else None,
            "max_s": s.hi if s.n else None}


def add_admin_routes(app: FastAPI, runtime: LiveDriver, *, token: str | None, max_events_bytes: int,
                     hook_mapper: tuple[HookMapper | None, type[Exception]] | None = None) -> None:
    mapper, payload_error = hook_mapper if hook_mapper is not None else claude_code_mapper()

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                check_token(request, token)
                return await handler(request)
            except HTTPProblem as exc:
                return exc.response()
        return endpoint

    async def events(request: Request) -> Response:
        raw = await read_body(request, max_events_bytes)
        try:
            batch = loads_batch(raw)
        except EventError as exc:
            raise HTTPProblem(400, str(exc), field=exc.field) from None
        rejected = [{"index": r.index, "field": r.field, "reason": r.reason} for r in batch.rejected]
        if rejected:
            runtime.metrics.dropped_events.labels("invalid").inc(len(rejected))
        if not batch.events:
            message = "no valid event in the batch" if rejected else "body: no events"
            return _json({"accepted": 0, "rejected": rejected, "error": {"message": message, "type": "invalid_request_error"}},
                         400)
        runtime.ingest(batch.events)
        return _json({"accepted": len(batch.events), "rejected": rejected})

    async def claude_code(request: Request) -> Response:
        """Claude Code reads an http hook's 2xx body as hook output (for SessionStart and
        UserPromptSubmit, output can reach the model's context), so the body is an empty
        object, which asks nothing of Claude Code; what was recorded travels in headers."""
        payload = parse_json_object(await read_body(request, max_events_bytes))
        if mapper is None:
            runtime.metrics.dropped_events.labels("unmapped_hook").inc()
            return _hook_answer(202, accepted=0, mapped=False)
        try:
            mapped = mapper(payload, time.time())
        except payload_error as exc:
            raise HTTPProblem(400, f"hook payload: {exc}", field="payload") from None
        if mapped:
            runtime.ingest(mapped)
        return _hook_answer(200, accepted=len(mapped), mapped=True)

    async def admit(request: Request) -> Response:
        body = parse_json_object(await read_body(request, max_events_bytes))
        unknown = sorted(set(body) - ADMIT_FIELDS)
        if unknown:
            raise HTTPProblem(400, f"{unknown[0]}: unknown field (expected some of {', '.join(sorted(ADMIT_FIELDS))})",
                              field=unknown[0])
        try:  # the same checks as an llm.start event, so errors name the field the same way
            wire = {"v": 1, "type": LLMStart.TYPE, "ts": time.time(), "request_id": uuid.uuid4().hex, **body}
            start = cast(LLMStart, decode_event(wire))
        except EventError as exc:
            raise HTTPProblem(400, str(exc), field=exc.field) from None
        try:
            admission = await runtime.admit(start.program_id, request_id=start.request_id, agent=start.agent,
                                            model=start.model, prompt_tokens=start.prompt_tokens)
        except NoWorkerAvailable as exc:
            raise HTTPProblem(503, str(exc), kind="service_unavailable") from None
        return _json({"program_id": start.program_id, "worker": admission.worker,
                      "waited_s": round(admission.waited_s, 6), "forced": admission.forced})

    async def programs(request: Request) -> Response:
        return _json(runtime.describe())

    async def program(request: Request) -> Response:
        pid = request.path_params["program_id"]
        found = runtime.describe([pid])
        if not found:
            raise HTTPProblem(404, f"program_id: no program {pid[:256]!r} is known to the runtime", field="program_id",
                              kind="not_found")
        return _json(found[0])

    async def tool_stats(request: Request) -> Response:
        history, log = runtime.state.history, runtime.state.predictions
        rows = [_stats(name, s) for name, s in sorted(history.by_tool.items())]
        rows += [{**_stats(name, s), "signature": True} for name, s in sorted(history.by_signature.items())]
        rows.append(_stats("*", history.overall))
        return _json({"tools": rows, "prediction": {"n": log.n, "mae_s": log.mae_s, "within_half_second": log.within_half_second_share}})

    async def journal(request: Request) -> Response:
        """The core's decisions as they took effect (``maitred serve --journal``): what the parity
        test compares with the replay's, and a record of why a program ran where it did."""
        if not runtime.cfg.journal:
            raise HTTPProblem(404, "the journal is off: start maitred serve with --journal", kind="not_found")
        return _json([{"t": e.t, "kind": e.kind, "program_id": e.program_id, "worker": e.worker, "detail": e.detail}
                      for e in runtime.core.journal])

    async def metrics(request: Request) -> Response:
        runtime.metrics.observe_state(runtime.state)
        return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        workers = {url: w.healthy for url, w in runtime.state.workers.items()}
        ok = any(workers.values())
        return _json({"status": "ok" if ok else "no healthy worker", "workers": workers,
                      "programs": len(runtime.state.programs), "policy": runtime.scheduler.policy.name,
                      "requests_in_flight": sum(runtime.inflight.values()), "requests_held": runtime.held_count(),
                      "tasks": len(asyncio.all_tasks())}, 200 if ok else 503)

    app.add_route("/v1/events", guarded(events), methods=["POST"], include_in_schema=False)
    app.add_route("/v1/hooks/claude-code", guarded(claude_code), methods=["POST"], include_in_schema=False)
    app.add_route("/v1/admit", guarded(admit), methods=["POST"], include_in_schema=False)
    app.add_route("/v1/programs", guarded(programs), methods=["GET"], include_in_schema=False)
    app.add_route("/v1/programs/{program_id:path}", guarded(program), methods=["GET"], include_in_schema=False)
    app.add_route("/v1/stats/tools", guarded(tool_stats), methods=["GET"], include_in_schema=False)
    app.add_route("/v1/journal", guarded(journal), methods=["GET"], include_in_schema=False)
    app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    app.add_route("/healthz", healthz, methods=["GET"], include_in_schema=False)

