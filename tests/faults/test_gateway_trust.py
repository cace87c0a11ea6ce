"""Who may change what on a gateway, end to end against real servers on 127.0.0.1: tokens cover
the model routes too, scoped tokens reach only their programs, a web page cannot post or read
(content types, ``Host``), claims are bounded by what can be true, only allow-listed body fields
reach the worker, and every refusal has maitred's one error shape."""

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from maitred.gateway.app import Gateway, ServeConfig, build_app
from maitred.gateway.loop import LiveConfig
from maitred.gateway.proxy import DROPPED_HEADER
from maitred.gateway.proxy_config import ProxyConfig
from maitred.gateway.serve import main as serve_main
from maitred.gateway.trust import Tokens
from maitred.harness.background import BackgroundServer
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig

pytestmark = pytest.mark.anyio
FAST = LiveConfig(tick_s=0.2, poll_s=0.2, hold_timeout_s=30.0)
ADMIN = "admin-token-0123456789"
ALICE = "alice-token-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorder:
    """A worker app that keeps the body of every model request it gets, then serves it."""

    def __init__(self, app: Any) -> None:
        self.app, self.bodies = app, []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] in ("/v1/tokenize",):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        self.bodies.append(json.loads(body))
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@dataclass
class Served:
    url: str
    gateway: Gateway
    workers: list[Recorder]


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    with ExitStack() as stack:

        def make(*, workers: int = 1, gpu_tokens: int = 200_000, runtime: LiveConfig = FAST, **cfg: Any) -> Served:
            recorders = [Recorder(create_app(SimWorkerConfig(gpu_tokens=gpu_tokens, time_scale=20.0))) for _ in range(workers)]
            sims = [stack.enter_context(BackgroundServer(r)) for r in recorders]
            gateway = build_app(ServeConfig([s.url for s in sims], runtime=runtime, wait_for_workers_s=10, **cfg))
            server = stack.enter_context(BackgroundServer(gateway.app))
            return Served(server.url, gateway, recorders)

        yield make


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": "fix the test"}], "max_tokens": 4, **extra}


def event(kind: str, pid: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "ts": time.time(), "program_id": pid, **fields}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- 11: the token covers the model routes, and a token can be scoped to programs -----------------


async def test_with_a_token_an_unauthenticated_model_request_cannot_touch_another_program(serve):
    s = serve(token=ADMIN)
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        r = await client.post(
            "/v1/events", headers=bearer(ADMIN), json=[event("tool.start", "victim", call_id="c1", tool="pytest")]
        )
        assert r.status_code == 200, r.text
        before = (await client.get("/v1/programs/victim", headers=bearer(ADMIN))).json()
        for path, body in (("/v1/chat/completions", chat()), ("/generate", {"text": "hi", "sampling_params": {}})):
            for headers in ({}, bearer("wrong-token-0123456789")):
                r = await client.post(path, json=body, headers={"X-Program-Id": "victim", **headers})
                assert r.status_code == 401 and r.json()["error"]["field"] == "authorization", r.text
        r = await client.post("/v1/messages", json=chat(), headers={"X-Program-Id": "victim"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        assert (await client.get("/v1/models")).status_code == 401
        assert not s.workers[0].bodies  # nothing reached the worker
        after = (await client.get("/v1/programs/victim", headers=bearer(ADMIN))).json()
        assert after == {**before, "idleness": after["idleness"], "readiness": after["readiness"]}
        assert after["phase"] == "acting"
        # the token as OpenAI clients send it (their API key) and as Anthropic clients do
        r = await client.post("/v1/chat/completions", json=chat(), headers={"X-Program-Id": "mine", **bearer(ADMIN)})
        assert r.status_code == 200, r.text
        r = await client.post("/v1/chat/completions", json=chat(), headers={"X-Program-Id": "mine", "x-api-key": ADMIN})
        assert r.status_code == 200, r.text
        assert (await client.get("/healthz")).status_code == 200 and (await client.get("/metrics")).status_code == 200


async def test_a_scoped_token_reaches_only_the_programs_of_its_prefixes(serve):
    tokens = Tokens.of(ADMIN, [f"{ALICE} alice- shared-"])
    s = serve(tokens=tokens, runtime=replace(FAST, journal=True))
    alice, admin = bearer(ALICE), bearer(ADMIN)
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        assert (await client.post("/v1/events", headers=admin, json=[event("program.start", "bob-1")])).status_code == 200
        r = await client.post("/v1/chat/completions", json=chat(program_id="bob-1"), headers=alice)
        assert r.status_code == 403 and r.json()["error"]["field"] == "program_id", r.text
        r = await client.post("/v1/messages", json=chat(), headers={"x-claude-code-session-id": "bob-1", **alice})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
        r = await client.post("/v1/admit", json={"program_id": "bob-1"}, headers=alice)
        assert r.status_code == 403 and r.json()["error"]["field"] == "program_id", r.text
        r = await client.post(
            "/v1/events",
            headers=alice,
            json=[
                event("program.start", "alice-1"),
                event("tool.start", "bob-1", call_id="c", tool="x"),
                event("program.start", "alice-2", parent_program_id="bob-1"),
                event("handoff", "alice-1", from_agent="a", to_agent="b", child_program_id="bob-2"),
            ],
        )
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        assert [(x["index"], x["field"]) for x in r.json()["rejected"]] == [
            (1, "program_id"),
            (2, "parent_program_id"),
            (3, "child_program_id"),
        ]
        r = await client.post(
            "/v1/hooks/claude-code",
            headers=alice,
            json={"hook_event_name": "PreToolUse", "session_id": "bob-1", "tool_name": "Bash", "tool_use_id": "t1"},
        )
        assert r.status_code == 403, r.text
        r = await client.post("/v1/chat/completions", json=chat(program_id="alice-1"), headers=alice)
        assert r.status_code == 200, r.text
        assert r.headers.get(DROPPED_HEADER) is None
        assert (await client.post("/v1/chat/completions", json=chat(), headers=alice)).status_code == 200  # one-step
        seen = {p["program_id"] for p in (await client.get("/v1/programs", headers=alice)).json()}
        assert seen == {"alice-1"}
        assert {"alice-1", "bob-1"} <= {p["program_id"] for p in (await client.get("/v1/programs", headers=admin)).json()}
        assert (await client.get("/v1/programs/bob-1", headers=alice)).status_code == 404
        assert (await client.get("/v1/journal", headers=alice)).status_code == 403
        assert (await client.get("/v1/journal", headers=admin)).status_code == 200
        assert (await client.get("/v1/programs/bob-1", headers=admin)).json()["phase"] != "acting"


def test_token_files_give_scopes_and_short_tokens_are_refused_at_start(tmp_path, capsys):
    path = tmp_path / "tokens"
    path.write_text(f"# who may do what\n{ALICE} alice- \n{ALICE} shared-\n{ADMIN}   # every program\n")
    tokens = Tokens.from_file(str(path))
    assert tokens.required
    table = dict(tokens._table)
    assert table[ALICE.encode()].prefixes == ("alice-", "shared-") and table[ADMIN.encode()].everything
    for argv, message in (
        (["--token", ""], "--token: a token needs at least 16 characters, got 0"),
        (["--token", "x"], "--token: a token needs at least 16 characters, got 1"),
        (["--token-file", str(tmp_path / "none")], "--token-file: cannot read"),
    ):
        assert serve_main([*argv, "--no-db", "--port", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"maitred serve: error: {message}") and err.count("\n") == 1, err
    path.write_text("short alice-\n")
    assert serve_main(["--token-file", str(path), "--no-db"]) == 2
    assert "line 1: a token needs at least 16 characters" in capsys.readouterr().err


# -- 13: a web page can neither post (content types) nor read through DNS rebinding (Host) ---------


async def test_a_web_page_can_neither_post_nor_read_through_a_rebound_name(serve):
    s = serve()
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        body = json.dumps([event("program.start", "csrf")])
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
            headers = {"content-type": content_type} if content_type else {}
            for path in ("/v1/events", "/v1/admit", "/v1/hooks/claude-code", "/v1/chat/completions"):
                r = await client.post(path, content=body, headers=headers)
                assert r.status_code == 415 and r.json()["error"]["field"] == "content-type", (path, r.text)
        r = await client.post("/v1/messages", content=body, headers={"content-type": "text/plain"})
        assert r.status_code == 415 and r.json()["type"] == "error", r.text
        r = await client.post("/v1/admit", content=b'{"program_id": "x"}', headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 415, r.text
        assert (await client.get("/v1/programs/csrf")).status_code == 404  # nothing got in
        ndjson = json.dumps(event("program.start", "nd")).encode()
        r = await client.post("/v1/events", content=ndjson, headers={"content-type": "application/x-ndjson"})
        assert r.status_code == 200, r.text
        r = await client.post("/v1/events", content=body, headers={"content-type": "application/json; charset=utf-8"})
        assert r.status_code == 200, r.text
        port = s.url.rsplit(":", 1)[1]
        r = await client.get("/v1/programs", headers={"host": f"attacker.example:{port}"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "host", r.text
        # the model routes are served ahead of FastAPI's stack (``front``), behind the same guard
        r = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"host": f"attacker.example:{port}"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "host", r.text
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
            assert (await client.get("/v1/programs", headers={"host": host})).status_code == 200, host


async def test_the_projects_own_clients_still_deliver_to_the_gateway(serve, tmp_path):
    """The middleware's HTTP sink and the Claude Code hook's deliverer post as before."""
    from maitred.events import ProgramStart
    from maitred.middleware.sinks import HttpSink

    s = serve()
    sink = HttpSink(s.url)
    try:
        await asyncio.to_thread(sink.send, [ProgramStart(ts=time.time(), program_id="sinked")])
    finally:
        sink.close()
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        assert (await client.get("/v1/programs/sinked")).status_code == 200
        hook = {"hook_event_name": "UserPromptSubmit", "session_id": "hooked", "prompt": "go"}
        r = await client.post("/v1/hooks/claude-code", json=hook)
        assert r.status_code == 200, r.text


def test_a_gateway_bound_to_a_named_host_answers_that_name():
    from maitred.gateway.origin import default_allowed_hosts, host_name

    assert default_allowed_hosts("127.0.0.1") == ("127.0.0.1", "localhost", "::1")
    assert default_allowed_hosts("::1") == ("::1", "127.0.0.1", "localhost")
    assert default_allowed_hosts("0.0.0.0") == ("*",)
    assert [host_name(h) for h in ("LocalHost:8000", "[::1]:80", "::1", "a.b")] == ["localhost", "::1", "::1", "a.b"]


# -- 12: claims the runtime believes are bounded by what can be true ---------------------------------


async def test_an_end_stamped_in_the_future_does_not_hold_the_programs_next_requests(serve):
    s = serve(runtime=replace(FAST, hold_timeout_s=5.0))
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        r = await client.post("/v1/events", json=[{**event("program.end", "late"), "ts": time.time() + 299}])
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", json=chat(program_id="late"))
        assert r.status_code == 200, r.text
        assert time.monotonic() - started < 2.0
        assert (await client.get("/v1/programs/late")).status_code == 200


async def test_claims_of_more_tokens_than_a_worker_holds_cannot_hold_the_fleet(serve):
    s = serve(workers=3, runtime=replace(FAST, hold_timeout_s=5.0))
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        r = await client.post("/v1/admit", json={"program_id": "hog-1", "prompt_tokens": 2**62})
        assert r.status_code == 200, r.text
        r = await client.post("/v1/events", json=[event("llm.start", "hog-2", request_id="r", prompt_tokens=2**62)])
        assert r.status_code == 200, r.text
        hogs = {p["program_id"]: p for p in (await client.get("/v1/programs")).json()}
        assert hogs["hog-1"]["context_tokens"] == 200_000 and hogs["hog-2"]["context_tokens"] == 200_000
        started = time.monotonic()
        r = await client.post("/v1/chat/completions", json=chat(program_id="newcomer"))
        assert r.status_code == 200, r.text
        assert time.monotonic() - started < 2.0
        r = await client.post("/v1/admit", json={"program_id": "another", "prompt_tokens": 1_000})
        assert r.status_code == 200 and not r.json()["forced"] and r.json()["waited_s"] < 1.0, r.text


# -- 14: only the route's fields reach the worker; maitred's own are refused -------------------------

RISKY = {
    "custom_logit_processor": '{"callable": "x"}',
    "bootstrap_host": "10.0.0.9",
    "bootstrap_port": 9999,
    "bootstrap_room": 7,
    "lora_path": "/etc/passwd",
    "return_hidden_states": True,
    "data_parallel_rank": 1,
    "routed_dp_rank": 1,
    "session_params": {"id": "someone-elses"},
}


async def test_only_allow_listed_body_fields_reach_the_worker(serve):
    s = serve()
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        r = await client.post("/v1/chat/completions", json=chat(program_id="p", top_k=5, **RISKY))
        assert r.status_code == 200, r.text
        assert r.headers[DROPPED_HEADER] == ",".join(sorted(RISKY))
        assert set(s.workers[0].bodies[-1]) == {"model", "messages", "max_tokens", "top_k"}
        r = await client.post("/v1/chat/completions", json=chat(stream=True, lora_path="x"))
        assert r.status_code == 200 and r.headers[DROPPED_HEADER] == "lora_path", r.text
        assert "lora_path" not in s.workers[0].bodies[-1]
        r = await client.post(
            "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}, "image_data": "/etc/passwd"}
        )
        assert r.status_code == 200 and r.headers[DROPPED_HEADER] == "image_data", r.text
        assert set(s.workers[0].bodies[-1]) == {"text", "sampling_params"}
        sent = len(s.workers[0].bodies)
        for path, body in (
            ("/v1/chat/completions", chat(priority=2**62)),
            ("/v1/completions", {"model": "sim", "prompt": "x", "rid": "someone-elses-request"}),
            ("/generate", {"text": "x", "priority": 1}),
        ):
            r = await client.post(path, json=body)
            field = "priority" if "priority" in body else "rid"
            assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
            assert "set by the maitred gateway" in r.json()["error"]["message"]
        r = await client.post("/v1/messages", json={**chat(), "priority": 3})
        assert r.status_code == 400 and r.json()["type"] == "error" and "priority" in r.json()["error"]["message"]
        assert len(s.workers[0].bodies) == sent


async def test_forward_unknown_fields_forwards_all_but_maitreds_own(serve):
    s = serve(proxy=ProxyConfig(forward_unknown_fields=True))
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        r = await client.post("/v1/chat/completions", json=chat(return_hidden_states=False, custom_field=1))
        assert r.status_code == 200 and DROPPED_HEADER not in r.headers, r.text
        assert {"return_hidden_states", "custom_field"} <= set(s.workers[0].bodies[-1])
        assert (await client.post("/v1/chat/completions", json=chat(rid="r"))).status_code == 400


# -- 15: names validated at the edge, quiet client disconnects, one error shape -----------------------


async def test_model_names_and_ids_the_store_cannot_hold_are_refused_at_the_edge(serve):
    s = serve()
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        for body, field in (
            (chat(model="m\x00"), "model"),
            (chat(model="m" * 5000), "model"),
            (chat(model=5), "model"),
            (chat(program_id="p\x00"), "program_id"),
        ):
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
        r = await client.post("/v1/messages", json={**chat(), "model": "m" * 5000})
        assert r.status_code == 400 and "model" in r.json()["error"]["message"], r.text
        assert not s.workers[0].bodies


async def test_what_maitred_refuses_has_its_one_error_shape(serve):
    s = serve()
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        for method, path, status in (("GET", "/v1/chat/completions", 405), ("GET", "/nowhere", 404)):
            r = await client.request(method, path)
            assert r.status_code == status and set(r.json()) == {"error"}, r.text
            assert r.json()["error"]["type"] in ("method_not_allowed", "not_found") and path in r.json()["error"]["message"]
        r = await client.get("/v1/messages")
        assert r.status_code == 405 and r.json()["type"] == "error", r.text


async def test_a_client_leaving_mid_body_is_one_quiet_line_not_a_traceback(serve, caplog):
    s = serve()
    host, port = s.url.removeprefix("http://").split(":")
    caplog.set_level(logging.DEBUG)
    uvicorn_log = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not propagate to caplog's
    uvicorn_log.addHandler(caplog.handler)
    for path in ("/v1/chat/completions", "/v1/events"):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{".encode()
            )
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
        assert (await client.get("/healthz")).status_code == 200
    uvicorn_log.removeHandler(caplog.handler)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
