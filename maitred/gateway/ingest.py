"""Ingest and introspection endpoints: events in, programs, tool statistics and metrics out.

``POST /v1/events`` takes a JSON array or NDJSON (``maitred.events.loads_batch``): good events
go into the live state and the store, bad ones are answered by index with the field and
reason; the answer is 4xx only when nothing in the batch was valid. ``POST
/v1/hooks/claude-code`` takes a Claude Code hook payload as Claude Code posts it. ``POST
/v1/admit`` is the gateway's admission for requests that reach the workers another way (the
LiteLLM callback): it answers once the program may run, with its worker. Ingest and
admin endpoints take a token when tokens are set, and a scoped token reaches only its own
programs (``maitred.gateway.trust``); ``/metrics`` and ``/healthz`` stay open for scrapers and
load balancers (they name no programs).
"""

import asyncio
import importlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson
from fastapi import Request
from starlette.responses import Response

from maitred.events import Batch, Event, EventError, LLMStart, Rejected, decode_event, loads_batch
from maitred.gateway.front import GatewayApp
from maitred.gateway.guard import ClientGone, HTTPProblem, error_response, parse_json_object, read_body
from maitred.gateway.loop import STORED_WAIT_S, LiveDriver
from maitred.gateway.metrics import CONTENT_TYPE
from maitred.gateway.offload import INLINE_BYTES, ingest_in_slices, off_loop
from maitred.gateway.standby import ShardRole
from maitred.gateway.trust import OPEN, Scope, Tokens
from maitred.gateway.worker_poll import NoWorkerAvailable
from maitred.runtime.history import DurationStats

log = logging.getLogger("maitred.service")
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
    return Response(
        b"{}",
        status_code=status,
        media_type="application/json",
        headers={"x-maitred-accepted": str(accepted), "x-maitred-mapped": "true" if mapped else "false"},
    )


def _screen(batch: Batch, scope: Scope) -> None:
    """Move the events of ``batch`` naming a program outside ``scope`` to its rejected ones, by
    their index in the batch as sent (one refused event never drops the good ones)."""
    if scope.everything:
        return
    refused = {r.index for r in batch.rejected}
    indices = (i for i in range(len(batch.events) + len(refused)) if i not in refused)
    kept: list[Event] = []
    for index, e in zip(indices, batch.events):
        outside = scope.outside(e)
        if outside is None:
            kept.append(e)
        else:
            batch.rejected.append(Rejected(index, outside, "not among this token's programs"))
    batch.events = kept
    batch.rejected.sort(key=lambda r: r.index)


def _stats(name: str, s: DurationStats) -> dict[str, Any]:
    return {
        "tool": name,
        "n": s.n,
        "mean_s": s.mean,
        "std_s": s.std,
        "min_s": s.lo if s.n else None,
        "max_s": s.hi if s.n else None,
    }


class _AdminRoutes:
    """The ingest and introspection endpoints of one gateway (one method each)."""

    def __init__(
        self,
        runtime: LiveDriver,
        *,
        max_events_bytes: int,
        mapper: HookMapper | None,
        payload_error: type[Exception],
        shard: ShardRole | None = None,
    ) -> None:
        self.runtime, self.max_events_bytes = runtime, max_events_bytes
        self.mapper, self.payload_error = mapper, payload_error
        self.shard = shard

    async def events(self, request: Request, scope: Scope) -> Response:
        raw = await read_body(request, self.max_events_bytes)
        try:
            batch = await off_loop(lambda: loads_batch(raw, whole_limit=INLINE_BYTES), len(raw))
        except EventError as exc:
            raise HTTPProblem(400, str(exc), field=exc.field) from None
        _screen(batch, scope)
        rejected = [{"index": r.index, "field": r.field, "reason": r.reason} for r in batch.rejected]
        if rejected:
            self.runtime.metrics.dropped_events.labels("invalid").inc(len(rejected))
        if not batch.events:
            message = "no valid event in the batch" if rejected else "body: no events"
            return _json(
                {"accepted": 0, "rejected": rejected, "error": {"message": message, "type": "invalid_request_error"}}, 400
            )
        lost = self._lost()
        duplicates = await ingest_in_slices(self.runtime, batch.events)
        not_stored = await self._not_stored(lost)
        if not_stored is not None:
            return not_stored
        return _json({"accepted": len(batch.events), "duplicates": duplicates, "rejected": rejected})

    def _lost(self) -> int:
        """Events the store writer lost so far (``_not_stored``'s argument); 0 without one."""
        writer = self.runtime.writer
        return 0 if writer is None else writer.lost()

    async def _not_stored(self, lost_before: int) -> Response | None:
        """Under ``--shard``, None once the events taken are where the standby would find them
        (``LiveDriver.stored``) and the store writer lost none since ``lost_before``; else the
        503 (with ``Retry-After``) to answer, and the client sends the batch again (the store
        keeps each event once)."""
        writer = self.runtime.writer
        if not self.runtime.answer_when_stored or writer is None:
            return None
        if not await self.runtime.stored():
            why = writer.problem() or writer.unavailable or f"not written within {STORED_WAIT_S:g} s"
        elif writer.lost() != lost_before:
            why = "the store writer dropped events meanwhile"
        else:
            return None
        message = f"events taken but not yet in the store ({why}): send them again"
        return error_response(503, message, kind="service_unavailable", headers={"retry-after": "1"})

    async def claude_code(self, request: Request, scope: Scope) -> Response:
        """Claude Code reads an http hook's 2xx body as hook output (for SessionStart and
        UserPromptSubmit, output can reach the model's context), so the body is an empty
        object, which asks nothing of Claude Code; what was recorded travels in headers."""
        payload = parse_json_object(await read_body(request, self.max_events_bytes))
        if self.mapper is None:
            self.runtime.metrics.dropped_events.labels("unmapped_hook").inc()
            return _hook_answer(202, accepted=0, mapped=False)
        try:
            mapped = self.mapper(payload, time.time())
        except self.payload_error as exc:
            raise HTTPProblem(400, f"hook payload: {exc}", field="payload") from None
        for e in mapped:
            outside = scope.outside(e)
            if outside is not None:
                raise scope.refuse(getattr(e, outside), outside)
        if mapped:
            lost = self._lost()
            self.runtime.ingest(mapped)
            not_stored = await self._not_stored(lost)
            if not_stored is not None:
                return not_stored
        return _hook_answer(200, accepted=len(mapped), mapped=True)

    async def admit(self, request: Request, scope: Scope) -> Response:
        body = parse_json_object(await read_body(request, self.max_events_bytes))
        unknown = sorted(set(body) - ADMIT_FIELDS)
        if unknown:
            raise HTTPProblem(
                400, f"{unknown[0]}: unknown field (expected some of {', '.join(sorted(ADMIT_FIELDS))})", field=unknown[0]
            )
        try:  # the same checks as an llm.start event, so errors name the field the same way
            wire = {"v": 1, "type": LLMStart.TYPE, "ts": time.time(), "request_id": uuid.uuid4().hex, **body}
            start = cast(LLMStart, decode_event(wire))
        except EventError as exc:
            raise HTTPProblem(400, str(exc), field=exc.field) from None
        scope.check(start.program_id)
        try:
            admission = await self.runtime.admit(
                start.program_id,
                request_id=start.request_id,
                agent=start.agent,
                model=start.model,
                prompt_tokens=start.prompt_tokens,
            )
        except NoWorkerAvailable as exc:
            raise HTTPProblem(503, str(exc), kind="service_unavailable") from None
        return _json(
            {
                "program_id": start.program_id,
                "worker": admission.worker,
                "waited_s": round(admission.waited_s, 6),
                "forced": admission.forced,
            }
        )

    async def programs(self, request: Request, scope: Scope) -> Response:
        described = self.runtime.describe()
        return _json(described if scope.everything else [p for p in described if scope.allows(p["program_id"])])

    async def program(self, request: Request, scope: Scope) -> Response:
        pid = request.path_params["program_id"]
        found = self.runtime.describe([pid]) if scope.allows(pid) else []  # another's: as if unknown
        if not found:
            raise HTTPProblem(
                404, f"program_id: no program {pid[:256]!r} is known to the runtime", field="program_id", kind="not_found"
            )
        return _json(found[0])

    async def tool_stats(self, request: Request, scope: Scope) -> Response:
        history, log = self.runtime.state.history, self.runtime.state.predictions
        rows = [_stats(name, s) for name, s in sorted(history.by_tool.items())]
        rows += [{**_stats(name, s), "signature": True} for name, s in sorted(history.by_signature.items())]
        rows.append(_stats("*", history.overall))
        return _json(
            {"tools": rows, "prediction": {"n": log.n, "mae_s": log.mae_s, "within_half_second": log.within_half_second_share}}
        )

    async def journal(self, request: Request, scope: Scope) -> Response:
        """The core's decisions as they took effect (``maitred serve --journal``): what the parity
        test compares with the replay's, and a record of why a program ran where it did. It names
        every program, so a scoped token cannot read it."""
        if not scope.everything:
            raise HTTPProblem(403, "the journal names every program: it needs an unscoped token", kind="permission_error")
        if not self.runtime.cfg.journal:
            raise HTTPProblem(404, "the journal is off: start maitred serve with --journal", kind="not_found")
        return _json(
            [
                {"t": e.t, "kind": e.kind, "program_id": e.program_id, "worker": e.worker, "detail": e.detail}
                for e in self.runtime.core.journal
            ]
        )

    async def metrics(self, request: Request) -> Response:
        self.runtime.metrics.observe_state(self.runtime.state)
        writer = self.runtime.writer
        self.runtime.metrics.store_writer_up.set(writer is not None and writer.problem() is None)
        return Response(self.runtime.metrics.render(), media_type=CONTENT_TYPE)

    async def healthz(self, request: Request) -> Response:
        """200 while the gateway serves and keeps its history; 503 with the reason when no
        worker is healthy, when it is shutting down (a balancer should send elsewhere), or when
        events no longer reach the store (the writer stopped, or the store can never be used:
        history is being lost, which a green check would hide). A store that is only down
        (retrying) stays 200 and says so in ``store``. Under ``--shard``, 503 too while this
        gateway is not its shard's holder (a standby, or a holder that lost the lease), naming
        the holder in ``lease_holder``."""
        workers = {url: w.healthy for url, w in self.runtime.state.workers.items()}
        telemetry_only = not workers  # started without workers: healthy, serving no model
        writer = self.runtime.writer
        store_problem = writer.problem() if writer is not None else None
        shard = self.shard
        if self.runtime.shutting_down:
            status, ok = "shutting down: new model requests are refused", False
        elif shard is not None and not shard.serving:
            status, ok = shard.status(), False
        elif store_problem is not None:
            status, ok = store_problem, False
        elif telemetry_only:
            status, ok = "telemetry only: no workers, model routes answer 503", True
        else:
            ok = any(workers.values())
            status = "ok" if ok else "no healthy worker"
        return _json(
            {
                "status": status,
                "store": None
                if writer is None
                else store_problem or (f"unavailable, retrying: {writer.unavailable}" if writer.unavailable else "ok"),
                "telemetry_only": telemetry_only,
                "workers": workers,
                "programs": len(self.runtime.state.programs),
                "policy": self.runtime.scheduler.policy.name,
                "requests_in_flight": sum(self.runtime.inflight.values()),
                "requests_held": self.runtime.held_count(),
                "tasks": len(asyncio.all_tasks()),
                "shard": shard.cfg.name if shard is not None else None,
                "role": shard.role if shard is not None else None,
                "lease_holder": shard.holder if shard is not None else None,
            },
            200 if ok else 503,
        )


def guarded(tokens: Tokens, handler: Callable[[Request, Scope], Any]) -> Callable[[Request], Any]:
    """An ingest or admin endpoint: the request's token decides its scope (401 without one when
    tokens are set), a refusal answers in maitred's error shape, a client gone mid-body gets 499."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request, tokens.scope_of(request))
        except HTTPProblem as exc:
            return exc.response()
        except ClientGone:
            log.debug("maitred: client left %s before sending its whole body", request.url.path)
            return Response(status_code=499)

    return endpoint


def add_admin_routes(
    app: GatewayApp,
    runtime: LiveDriver,
    *,
    tokens: Tokens = OPEN,
    max_events_bytes: int,
    hook_mapper: tuple[HookMapper | None, type[Exception]] | None = None,
    shard: ShardRole | None = None,
) -> None:
    mapper, payload_error = hook_mapper if hook_mapper is not None else claude_code_mapper()
    r = _AdminRoutes(runtime, max_events_bytes=max_events_bytes, mapper=mapper, payload_error=payload_error, shard=shard)
    for path, handler, method in (
        ("/v1/events", r.events, "POST"),
        ("/v1/hooks/claude-code", r.claude_code, "POST"),
        ("/v1/admit", r.admit, "POST"),
        ("/v1/programs", r.programs, "GET"),
        ("/v1/programs/{program_id:path}", r.program, "GET"),
        ("/v1/stats/tools", r.tool_stats, "GET"),
        ("/v1/journal", r.journal, "GET"),
    ):
        if method == "POST":  # what agents send with every tool call: ahead of FastAPI's stack (``front``)
            app.post_ahead(path, guarded(tokens, handler))
        else:
            app.add_route(path, guarded(tokens, handler), methods=[method], include_in_schema=False)
    app.add_route("/metrics", r.metrics, methods=["GET"], include_in_schema=False)
    app.add_route("/healthz", r.healthz, methods=["GET"], include_in_schema=False)
