"""The gateway's model routes: model requests in, each sent to its program's worker.

What SGLang serves passes through, streaming and not: OpenAI's ``POST /v1/chat/completions``,
``/v1/completions`` and ``/v1/responses``, Anthropic's ``/v1/messages`` (errors there in
Anthropic's shape), and SGLang's ``/generate``: the program id is taken out of the request
(``programid``), with tokens set the
request's token must cover that program (``trust``), only the route's allow-listed body fields
are kept (``fields``), the
request waits until the runtime admits its program (at once when it fits), goes to the
program's worker with its SGLang ``priority`` when configured, and what the worker reports
(tokens, cached tokens) goes back into the runtime state and the store. Answers are passed
through byte for byte, streams chunk by chunk. ``/v1/messages/count_tokens`` generates
nothing: it goes to the program's worker (or any) without admission and is not accounted.

At shutdown (``drain``, ``maitred serve --shutdown-timeout``) new model requests are refused
with 503, those in flight get the timeout to finish, and the rest are ended cleanly: a request
not answered yet gets a 503 error body, a stream its error event in its API's shape, and the
runtime stores its ``llm.end`` (cancelled for a request not answered, error for a cut stream).

A worker that cannot be reached (refused or dropped connection) is declared down; its
programs are re-placed on another worker and the request is sent again there (a recompute):
the client sees no error. A stream that already sent bytes cannot be replayed, so a worker
that dies mid-stream ends it with an error event; a stream whose worker died before its first
byte is retried like any request.

Model requests go to the workers through aiohttp, not httpx: measured on this project's 2-core
machine against a simulated worker, one request through httpx's client took 3.6 ms and through
aiohttp's 1.2 ms: the difference alone is more than the gateway's whole 1 ms added-latency
budget. What the gateway asks the workers itself (health, load, warmups) goes through aiohttp
too, on a pool of its own (``pool``).
"""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive

from maitred.events import name_problem
from maitred.gateway.anthropic import check_anthropic_body
from maitred.gateway.client_gone import unless_gone
from maitred.gateway.fields import screen_fields
from maitred.gateway.front import GatewayApp
from maitred.gateway.guard import ClientGone, HTTPProblem, error_response, parse_json_object, read_body
from maitred.gateway.loop import LiveDriver, NoWorkerAvailable
from maitred.gateway.model_call import Call
from maitred.gateway.model_routes import ENDPOINTS, Route, no_workers
from maitred.gateway.models import list_models
from maitred.gateway.offload import off_loop
from maitred.gateway.oversize import check_fits
from maitred.gateway.passthrough import WORKER_DOWN, Piped, Relay
from maitred.gateway.pool import WorkerPool
from maitred.gateway.programid import take_program_id
from maitred.gateway.proxy_config import ProxyConfig
from maitred.gateway.tracecontext import trace_context
from maitred.gateway.trust import OPEN, Scope, Tokens
from maitred.gateway.usage import Usage, prompt_size, usage_of, warm_prompt

log = logging.getLogger("maitred.service")

JSON = {"content-type": "application/json"}
#: Names the body fields a request had that were not forwarded (``maitred.gateway.fields``).
DROPPED_HEADER = "x-maitred-dropped-fields"
#: The balancer's id of a client request, the same on each of its retries (``examples/haproxy-standby.cfg``
#: sets it): the model call's request id in the store (``LiveDriver.new_request_id``).
REQUEST_ID_HEADER = "x-maitred-request-id"
#: After the shutdown timeout, how long the requests ended then get to send their error.
CUT_GRACE_S = 5.0


class Proxy:
    def __init__(self, runtime: LiveDriver, cfg: ProxyConfig, *, max_connections: int = 1024, tokens: Tokens = OPEN) -> None:
        self.runtime = runtime
        self.cfg = cfg
        self.tokens = tokens  # with tokens set, model requests need one too (``trust``)
        timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s, connect=5.0)
        self.pool = WorkerPool("model requests'", max_connections, timeout, decompress=False)  # answers pass through as sent
        self._requests: set[asyncio.Task[Any]] = set()  # handlers running (not yet streaming)
        self._pipes: set[Piped] = set()  # streams being passed through
        self._cut: str | None = None  # why the requests still running are being ended (shutdown)

    async def start(self) -> None:
        await self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()

    @property
    def session(self) -> aiohttp.ClientSession:
        return self.pool.session()

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: what the workers that are up serve (``maitred.gateway.models``)."""
        try:
            self.tokens.scope_of(request)
        except HTTPProblem as exc:
            return exc.response()
        return await list_models(self.session, [url for url, w in self.runtime.state.workers.items() if w.healthy])

    def connections_in_use(self) -> int:
        """Connections to workers currently carrying a request (0 when all went back to the pool)."""
        return self.pool.in_use()

    def in_flight(self) -> int:
        """Model requests being handled or streamed."""
        return len(self._requests) + len(self._pipes)

    async def drain(self, timeout_s: float, *, forced: Callable[[], bool] = lambda: False) -> int:
        """Graceful shutdown: from now on new model requests answer 503; those in flight get
        ``timeout_s`` to finish (``forced``: stop waiting at once, a second signal), then each
        one left is ended cleanly (``handle``, ``Piped.cut``) rather than cancelled with a
        traceback. Returns how many were ended so."""
        self.runtime.shutting_down = True
        deadline = time.monotonic() + timeout_s
        if self.in_flight():
            log.info(
                "maitred: shutting down; %d model requests in flight get up to %g s (--shutdown-timeout)",
                self.in_flight(),
                timeout_s,
            )
        while self.in_flight() and time.monotonic() < deadline and not forced():
            await asyncio.sleep(0.05)
        left = self.in_flight()
        if not left:
            return 0
        log.warning(
            "maitred: shutting down; ending %d model requests still running after %g s (--shutdown-timeout)", left, timeout_s
        )
        self._cut = f"the gateway shut down before the request finished (--shutdown-timeout {timeout_s:g} s); send it again"
        for task in self._requests:
            task.cancel()
        for piped in self._pipes:
            piped.cut(self._cut)
        deadline = time.monotonic() + CUT_GRACE_S
        while self.in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return left

    async def handle(self, request: Request) -> Response:
        """One model request, timed from its arrival to its answer's last byte (a stream's when
        it ends) for ``maitred_request_duration_seconds``."""
        started = time.perf_counter()
        path = request.scope["path"]
        route = ENDPOINTS[path]
        response = await self._answer(route, path, request)
        metrics, status = self.runtime.metrics, response.status_code

        def timed(streamed: bool) -> None:
            metrics.observe_request(route.name, status, stream=streamed, seconds=time.perf_counter() - started)

        if isinstance(response, Relay):
            response.after_close(lambda: timed(True))
        else:
            timed(False)
        return response

    async def _answer(self, route: Route, path: str, request: Request) -> Response:
        endpoint = route.name
        if self.runtime.shutting_down:
            self.runtime.metrics.requests.labels(endpoint, "shutting_down").inc()
            return error_response(
                503,
                "the gateway is shutting down and takes no new requests; send it to another gateway or retry shortly",
                kind="service_unavailable",
                headers={"retry-after": "1", "connection": "close"},
                anthropic=route.anthropic,
            )
        task = asyncio.current_task()
        assert task is not None
        self._requests.add(task)
        call: Call | None = None
        try:
            scope = self.tokens.scope_of(request)  # before the body is read: 32 MB is not read for nobody
            raw = await read_body(request, self.cfg.max_body_bytes)
            body = await off_loop(lambda: parse_json_object(raw), len(raw))
            call = self._prepare(route, path, body, raw, request, scope)
            response = await (self._send(call, request.receive) if route.generates else self._ask(call))
            if call.dropped:
                response.headers[DROPPED_HEADER] = ",".join(call.dropped)
            return response
        except asyncio.CancelledError:
            if self._cut is None:
                raise
            task.uncancel()  # ended by ``drain``: answer the client instead of dying with a traceback
            if call is not None and route.generates:
                self.runtime.cut_short(call.program_id, call.request_id, anonymous=call.anonymous)
            self.runtime.metrics.requests.labels(endpoint, "shutting_down").inc()
            return error_response(503, self._cut, kind="service_unavailable", anthropic=route.anthropic)
        except ClientGone:
            self.runtime.metrics.requests.labels(endpoint, "client_gone").inc()
            return Response(status_code=499)  # nobody reads it: the client left
        except HTTPProblem as exc:
            self.runtime.metrics.requests.labels(endpoint, "refused").inc()
            return exc.response(anthropic=route.anthropic)
        except NoWorkerAvailable as exc:
            self.runtime.metrics.requests.labels(endpoint, "no_worker").inc()
            return error_response(
                503,
                f"no worker can take the request: {exc}",
                kind="service_unavailable",
                headers={"retry-after": "1"},
                anthropic=route.anthropic,
            )
        finally:
            self._requests.discard(task)

    def _prepare(self, route: Route, path: str, body: dict[str, Any], raw: bytes, request: Request, scope: Scope) -> Call:
        if route.anthropic:
            check_anthropic_body(body, counting=not route.generates)
        program_id, changed = take_program_id(body, request.headers)
        scope.check(program_id)
        dropped = screen_fields(route.name, body, forward_unknown=self.cfg.forward_unknown_fields)
        if program_id is not None:  # a subagent names its parent's session: the one running child's
            program_id = self.runtime.state.speaker(program_id)
        model = body.get("model")
        problem = None if model is None else name_problem(model)
        if problem is not None:  # it goes into the program's history: refused here, not lost in the store
            raise HTTPProblem(400, f"model: {problem}", field="model", kind="invalid_request_error")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise HTTPProblem(400, f"stream: expected true or false, got {stream!r}", field="stream")
        anonymous = program_id is None
        try:
            request_id = self.runtime.new_request_id(request.headers.get(REQUEST_ID_HEADER))
        except ValueError as exc:
            raise HTTPProblem(400, f"{REQUEST_ID_HEADER}: {exc}", field=REQUEST_ID_HEADER) from None
        call = Call(
            route,
            path,
            body,
            raw,
            changed or bool(dropped),
            program_id or "anon-" + self.runtime.new_request_id(),
            anonymous,
            stream,
            request_id,
            dropped=dropped,
            trace=trace_context(request.headers),
        )
        if stream and route.api == "openai":
            options = body.get("stream_options")
            if options is None or (isinstance(options, dict) and not options.get("include_usage")):
                body["stream_options"] = {**(options or {}), "include_usage": True}
                call.injected_usage = call.changed = True
        return call

    async def _send(self, call: Call, receive: Receive) -> Response:
        runtime, body = self.runtime, call.body
        model = body.get("model") if isinstance(body.get("model"), str) else None
        size = call.size = await off_loop(lambda: prompt_size(body), len(call.raw))
        check_fits(body, size, runtime.state.workers, runtime.chars_per_token(call.program_id))
        # Only chat-shaped messages can be rendered for a warmup (SGLang's /v1/tokenize)
        prompt = warm_prompt(body) if call.route.api == "openai" else None
        if prompt is not None and not call.anonymous:
            runtime.remember_prompt(call.program_id, prompt, size)
        estimate = runtime.estimate_prompt(call.program_id, size)
        try:
            return await self._attempts(call, model, estimate, receive)
        except (ClientGone, NoWorkerAvailable):
            runtime.forget_prompt(call.program_id)  # never sent, or cut short: no worker holds it
            raise

    async def _attempts(self, call: Call, model: str | None, estimate: int | None, receive: Receive) -> Response:
        """Send ``call`` to its program's worker, again elsewhere when a worker dies under it."""
        runtime, body = self.runtime, call.body
        for attempt in range(self.cfg.max_attempts):
            admission = await unless_gone(
                runtime.admit(
                    call.program_id,
                    request_id=call.request_id,
                    agent=None,
                    model=model,
                    prompt_tokens=estimate,
                    store=not call.anonymous,
                    trace_id=call.trace_id,
                ),
                receive,
            )
            worker = admission.worker
            # SGLang builds its /v1/messages request without the body's priority: none is sent there
            priority = None if call.route.anthropic else runtime.priority_for(call.program_id, worker)
            if priority is not None:
                body["priority"] = priority
                call.changed = True
            content = orjson.dumps(body) if call.changed else call.raw
            url = worker + call.path
            runtime.inflight[worker] += 1
            started = time.perf_counter()
            try:
                if call.stream:
                    return await self._stream(call, worker, url, content, started, receive)
                status, payload, media_type = await unless_gone(self._post(url, content, _headers(call)), receive)
            except ClientGone:  # the client left: its connection to the worker was closed, which aborts it there
                self._finish(call, worker, Usage(), None, ok=False)
                raise
            except WORKER_DOWN as exc:
                await self._lost(call, worker, exc, attempt)
                continue
            except TimeoutError:
                self._finish(call, worker, Usage(), None, ok=False)
                runtime.metrics.requests.labels(call.endpoint, "timeout").inc()
                return error_response(
                    504,
                    f"worker {worker} did not answer within {self.cfg.request_timeout_s:.0f} s",
                    kind="timeout",
                    anthropic=call.route.anthropic,
                )
            finally:
                if not call.stream:
                    runtime.inflight[worker] -= 1
            ok = status == 200
            usage = usage_of(_json(payload)) if ok else Usage()
            self._finish(call, worker, usage, time.perf_counter() - started, ok=ok)
            if not ok:
                runtime.forget_prompt(call.program_id)  # refused: not a prompt the worker holds
            runtime.metrics.requests.labels(call.endpoint, "ok" if ok else f"worker_{status}").inc()
            await runtime.stored()  # under --shard: its record where a standby would find it
            return Response(payload, status_code=status, media_type=media_type)
        runtime.metrics.requests.labels(call.endpoint, "failed").inc()
        return error_response(
            502,
            f"no worker completed the request after {self.cfg.max_attempts} attempts",
            kind="bad_gateway",
            anthropic=call.route.anthropic,
        )

    async def _post(self, url: str, content: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        """One whole answer from a worker. Cancelled (the client left), the connection is closed,
        not returned to the pool: SGLang aborts a request whose connection closes (it checks
        every ``SGLANG_REQUEST_STATE_WAIT_TIMEOUT``, 4 s, while generating), so the worker stops
        generating an answer nobody will read."""
        async with self.session.post(url, data=content, headers=headers) as response:
            try:
                payload = await response.read()
            except asyncio.CancelledError:
                response.close()
                raise
            return response.status, payload, response.headers.get("content-type", "application/json")

    async def _ask(self, call: Call) -> Response:
        """A request that generates nothing (``count_tokens``): to the program's worker when it
        has one that is up, else to any worker that is up; no admission, nothing accounted."""
        workers = self.runtime.state.workers
        program = self.runtime.state.programs.get(call.program_id)
        home = program.home_worker if program is not None else None
        worker = home if home is not None and home in workers and workers[home].healthy else None
        worker = worker or next((url for url, w in workers.items() if w.healthy), None)
        if worker is None:
            raise NoWorkerAvailable("every worker is down")
        content = orjson.dumps(call.body) if call.changed else call.raw
        try:
            async with self.session.post(worker + call.path, data=content, headers=_headers(call)) as response:
                payload = await response.read()
                status, media_type = response.status, response.headers.get("content-type", "application/json")
        except (TimeoutError, *WORKER_DOWN) as exc:
            self.runtime.metrics.requests.labels(call.endpoint, "failed").inc()
            return error_response(
                502, f"worker {worker} did not answer ({type(exc).__name__})", kind="bad_gateway", anthropic=call.route.anthropic
            )
        self.runtime.metrics.requests.labels(call.endpoint, "ok" if status == 200 else f"worker_{status}").inc()
        return Response(payload, status_code=status, media_type=media_type)

    async def _lost(self, call: Call, worker: str, exc: Exception, attempt: int) -> None:
        """The connection to ``worker`` failed. Refused: the worker is down. Dropped: it may
        be down, or it closed an idle keep-alive connection just as the request went out (a
        benign race); its health check tells which, and only a failed one re-places programs."""
        self.runtime.metrics.requests.labels(call.endpoint, "retried").inc()
        if not isinstance(exc, aiohttp.ClientConnectorError) and await self.runtime.backends[worker].healthy():
            log.info(
                "maitred: %s to %s dropped (%s) but the worker is healthy; sending again",
                call.endpoint,
                worker,
                type(exc).__name__,
            )
            return
        log.warning("maitred: %s to %s failed (%s: %s); attempt %d", call.endpoint, worker, type(exc).__name__, exc, attempt + 1)
        self.runtime.worker_failed(worker, reason=type(exc).__name__)

    def _finish(self, call: Call, worker: str, usage: Usage, ttft_s: float | None, *, ok: bool) -> None:
        if ttft_s is not None:
            self.runtime.metrics.observe_ttft(call.endpoint, stream=call.stream, seconds=ttft_s)
        self.runtime.completed(
            call.program_id,
            request_id=call.request_id,
            worker=worker,
            size=call.size,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            ttft_s=ttft_s,
            ok=ok,
            store=not call.anonymous,
            trace_id=call.trace_id,
        )
        if call.anonymous:
            self.runtime.end_anonymous(call.program_id)

    async def _stream(self, call: Call, worker: str, url: str, content: bytes, started: float, receive: Receive) -> Response:
        """Open the worker's stream and wait for its first chunk before answering, so a worker
        that is gone is still retried elsewhere; then pass the chunks through. A client that
        leaves before the first chunk closes the worker's connection too (SGLang aborts then)."""
        runtime = self.runtime
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                runtime.inflight[worker] -= 1

        try:
            upstream = await unless_gone(self.session.post(url, data=content, headers=_headers(call)), receive)
        except BaseException:
            release()
            raise
        if upstream.status != 200:
            try:
                payload = await upstream.read()
            finally:
                upstream.release()
                release()
            self._finish(call, worker, Usage(), None, ok=False)
            runtime.forget_prompt(call.program_id)  # refused: not a prompt the worker holds
            runtime.metrics.requests.labels(call.endpoint, f"worker_{upstream.status}").inc()
            return Response(
                payload, status_code=upstream.status, media_type=upstream.headers.get("content-type", "application/json")
            )
        try:
            first = await unless_gone(upstream.content.readany(), receive)
        except BaseException:
            upstream.close()
            release()
            raise
        piped = Piped(self, call, worker, upstream, release, time.perf_counter() - started)
        self._pipes.add(piped)
        return Relay(piped, first, media_type=upstream.headers.get("content-type", "text/event-stream"))


def _headers(call: Call) -> dict[str, str]:
    """What goes to the worker with the body: its type, and the client's trace context (``tracecontext``)."""
    return JSON if call.trace is None else {**JSON, **call.trace.headers}


def _json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def add_proxy_routes(app: GatewayApp, proxy: Proxy | None) -> None:
    """The model routes (``proxy`` None: a gateway without workers, whose model routes say so),
    answered ahead of FastAPI's stack (``front``)."""
    for path in ENDPOINTS:
        app.post_ahead(path, proxy.handle if proxy is not None else no_workers)
    app.add_route("/v1/models", proxy.models if proxy is not None else no_workers, methods=["GET"], include_in_schema=False)
