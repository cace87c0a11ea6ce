"""``maitred serve`` as a process through its life: a store it cannot open, a store writer that
dies, SIGTERM with requests in flight and with the store down, ``kill -9`` and a restart on the
same store, and a client re-sending a batch. Real processes on 127.0.0.1 (``maitred serve``,
``maitred sim-worker``), a real SQLite file and a real PostgreSQL (cut off by a TCP proxy)."""

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from maitred.harness.background import free_port, wait_http
from maitred.storage import SessionStore
from tests.conftest import POSTGRES_URL
from tests.helpers import TcpProxy, throwaway_schemas, wait_until


class Serve:
    """One ``maitred serve`` child process, its stderr kept in a file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "maitred.gateway.serve", "--port", str(self.port), "--tick", "0.2", *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def ready(self) -> "Serve":
        wait_http(self.url + "/healthz", timeout_s=60, process=self.proc)
        return self

    def stderr(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``launch("serve", args)`` or ``launch("sim", args)``: a child process, stopped at the end."""
    with ExitStack() as stack:
        made = iter(range(1000))

        def start(kind: str, args: list[str]) -> Any:
            if kind == "serve":
                serve = Serve(args, tmp_path / f"serve-{next(made)}.log")
                stack.callback(serve.stop)
                return serve
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-m", "maitred.sim.worker", "--port", str(port), "--gpu-tokens", "400000", *args]
            )
            url = f"http://127.0.0.1:{port}"
            stack.callback(lambda: (proc.kill(), proc.wait()))
            wait_http(url + "/health", timeout_s=60, process=proc)
            return url

        yield start


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gateway.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "g") as make:
        yield make()


def events_for(pid: str, n_tools: int, *, ts: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n_tools):
        out.append({"type": "tool.start", "ts": ts + i, "program_id": pid, "call_id": f"c{i}", "tool": "pytest"})
        out.append({"type": "tool.end", "ts": ts + i + 0.5, "program_id": pid, "call_id": f"c{i}", "status": "ok"})
    return out


def reliability(**figures: Any) -> None:
    print("RELIABILITY " + json.dumps(figures))


# -- 1. a store that cannot be opened, a writer that dies -----------------------------------------


@pytest.mark.parametrize(
    "db, says",
    [
        ("postgresql+psycopg2://postgres@127.0.0.1:5432/test", "database driver 'psycopg2' is not installed"),
        ("postgresql+asyncpg://postgres@127.0.0.1:5432/test", "database driver 'asyncpg' is not installed"),
        ("corrupt", "database is corrupt"),
    ],
)
def test_serve_refuses_to_start_on_a_store_it_cannot_open(launch, tmp_path, db, says):
    """Before: the writer thread died with a traceback, /healthz said ok and every event was
    lost uncounted (1,000 of 1,000). Now: one line naming --db, exit status 1, nothing served."""
    if db == "corrupt":
        path = tmp_path / "not-a-database.db"
        path.write_bytes(b"this is not SQLite" * 100)
        db = f"sqlite:///{path}"
    serve = launch("serve", ["--db", db])
    assert serve.proc.wait(60) == 1
    lines = [line for line in serve.stderr().splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and lines[0].startswith("maitred serve: error: --db: ") and says in lines[0], serve.stderr()
    assert "Traceback" not in serve.stderr()


def test_a_store_writer_that_dies_is_said_in_healthz_metrics_and_the_log(tmp_path, monkeypatch, caplog):
    """Whatever kills the writer thread (here: what a missing driver raised before the store
    translated it), the gateway goes on serving, /healthz answers 503 naming it,
    maitred_store_writer_up reads 0 and every accepted event is counted dropped."""
    import maitred.gateway.app as app_module
    from maitred.gateway.app import ServeConfig, build_app
    from maitred.harness.background import BackgroundServer

    def no_driver(url: str) -> Any:
        raise ModuleNotFoundError("No module named 'psycopg2'")

    monkeypatch.setattr(app_module, "_open_store", no_driver)
    gateway = build_app(ServeConfig([], db_url=f"sqlite:///{tmp_path / 'x.db'}"))
    with BackgroundServer(gateway.app) as server:
        batch = [e for i in range(250) for e in events_for(f"p{i}", 2, ts=time.time())]
        r = httpx.post(server.url + "/v1/events", json=batch, timeout=30)
        assert r.status_code == 200 and r.json()["accepted"] == 1000
        health = httpx.get(server.url + "/healthz")
        assert health.status_code == 503
        assert health.json()["status"] == "store writer stopped: ModuleNotFoundError: No module named 'psycopg2'"
        metrics = httpx.get(server.url + "/metrics").text
        assert "maitred_store_writer_up 0.0" in metrics
        assert 'maitred_dropped_events_total{reason="writer_stopped"} 1000.0' in metrics
    assert any("the store writer stopped" in r.getMessage() for r in caplog.records)
    reliability(scenario="store writer dies (missing driver)", accepted=1000, stored=0, counted_dropped=1000)


# -- 2. the store down at shutdown --------------------------------------------------------------


@pytest.mark.parametrize("store_back", [False, True], ids=["stays-down", "back-during-drain"])
def test_sigterm_with_the_store_down_drains_within_the_timeout_and_logs_what_is_lost(launch, store_back):
    """Before: 3,000 of 3,000 queued events dropped on SIGTERM, no log line. Now: the drain
    retries for --drain-timeout; what the store takes is stored, the rest is one log line with
    the count."""
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "d") as make:
        url = make()
        SessionStore(url).close()  # the schema exists: the gateway starts on it
        host_port = url.split("@", 1)[1].split("/", 1)[0]
        proxy = TcpProxy("127.0.0.1", int(host_port.rsplit(":", 1)[1])).up()
        proxied = url.replace(host_port, f"127.0.0.1:{proxy.port}")
        drain = "60" if store_back else "1"
        serve = launch("serve", ["--db", proxied, "--drain-timeout", drain]).ready()
        proxy.down()
        batch = [e for i in range(1500) for e in events_for(f"p{i}", 1, ts=time.time())]
        assert httpx.post(serve.url + "/v1/events", json=batch, timeout=60).json()["accepted"] == 3000
        serve.proc.send_signal(signal.SIGTERM)
        if store_back:
            proxy.up()
        serve.proc.wait(120)
        proxy.down()
        with SessionStore(url) as store:
            stored = len(store.events())
        logged = [line for line in serve.stderr().splitlines() if "not stored at shutdown" in line]
        if store_back:
            assert stored == 3000 and logged == []
        else:
            assert stored == 0 and len(logged) == 1 and "3000 events not stored at shutdown" in logged[0], serve.stderr()
            assert "--drain-timeout" in logged[0]
        reliability(
            scenario=f"SIGTERM, store down, {'back during the drain' if store_back else 'stays down'}",
            accepted=3000,
            stored=stored,
            counted_lost=3000 - stored if logged else 0,
        )


# -- 3. SIGTERM with requests in flight -----------------------------------------------------------


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, str]:
    r = await client.post(path, json=body)
    return r.status_code, r.text


async def _stream(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, str]:
    async with client.stream("POST", path, json={**body, "stream": True}) as r:
        text = "".join([chunk async for chunk in r.aiter_text()])
    return r.status_code, text


def _chat(pid: str, max_tokens: int) -> dict[str, Any]:
    return {"model": "m", "program_id": pid, "max_tokens": max_tokens, "messages": [{"role": "user", "content": pid}]}


async def _in_flight(serve: Serve, n: int) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(6000):
            if (await client.get(serve.url + "/healthz")).json()["requests_in_flight"] >= n:
                return
            await asyncio.sleep(0.01)
    raise AssertionError(f"{n} requests never were in flight")


async def _sigterm_with_requests(serve: Serve, n: int, max_tokens: int) -> dict[str, list[tuple[int, str]]]:
    async with httpx.AsyncClient(base_url=serve.url, timeout=600, limits=httpx.Limits(max_connections=500)) as client:
        plain = [asyncio.ensure_future(_post(client, "/v1/chat/completions", _chat(f"plain-{i}", max_tokens))) for i in range(n)]
        streams = [
            asyncio.ensure_future(_stream(client, "/v1/chat/completions", _chat(f"stream-{i}", max_tokens))) for i in range(n)
        ]
        messages = [
            asyncio.ensure_future(_stream(client, "/v1/messages", _chat(f"msg-{i}", max_tokens) | {"model": "claude"}))
            for i in range(n)
        ]
        await _in_flight(serve, 3 * n)
        serve.proc.send_signal(signal.SIGTERM)
        for _ in range(6000):  # the drain has begun: the gateway says so, and refuses new requests
            health = await client.get("/healthz")
            if health.status_code == 503:
                break
            await asyncio.sleep(0.01)
        assert health.json()["status"] == "shutting down: new model requests are refused"
        late = await client.post("/v1/chat/completions", json=_chat("late", 4))
        return {
            "plain": list(await asyncio.gather(*plain)),
            "streams": list(await asyncio.gather(*streams)),
            "messages": list(await asyncio.gather(*messages)),
            "late": [(late.status_code, late.text)],
        }


def _llm_ends(url: str) -> dict[str, str]:
    with SessionStore(url) as store:
        return {e["program_id"]: e["status"] for e in store.events() if e["type"] == "llm.end"}


def test_sigterm_ends_requests_past_the_shutdown_timeout_cleanly_and_stores_every_llm_end(launch, tmp_path):
    """Before: past a fixed 10 s, 50 plain requests got HTTP 500 with a CancelledError
    traceback, 50 streams were cut without an error event or [DONE], and the plain requests'
    llm.end were never stored. Now: each gets an error it can read, in its route's shape, and
    every request's llm.end is stored."""
    worker = launch("sim", ["--time-scale", "0.05"])  # 2,000 tokens take minutes
    db = f"sqlite:///{tmp_path / 'shutdown.db'}"
    serve = launch("serve", ["--worker", worker, "--db", db, "--shutdown-timeout", "1"]).ready()
    n = 20
    got = asyncio.run(_sigterm_with_requests(serve, n, max_tokens=2000))
    assert serve.proc.wait(60) in (0, -signal.SIGTERM)
    assert "Traceback" not in serve.stderr() and "CancelledError" not in serve.stderr()
    status, text = got["late"][0]
    assert status == 503 and "shutting down" in json.loads(text)["error"]["message"]
    for status, text in got["plain"]:
        assert status == 503 and "--shutdown-timeout 1 s" in json.loads(text)["error"]["message"], text
    for status, text in got["streams"]:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]", text
        assert "--shutdown-timeout 1 s" in json.loads(events[-2])["error"]["message"]
    for status, text in got["messages"]:
        lines = [line for line in text.splitlines() if line]
        assert status == 200 and lines[-2] == "event: error", text
        error = json.loads(lines[-1].removeprefix("data: "))
        assert error["type"] == "error" and "--shutdown-timeout 1 s" in error["error"]["message"]
    ends = _llm_ends(db)
    assert len(ends) == 3 * n and set(ends.values()) <= {"cancelled", "error"}
    reliability(
        scenario="SIGTERM, requests longer than --shutdown-timeout",
        sent=3 * n + 1,
        completed=0,
        ended_with_a_readable_error=3 * n + 1,
        llm_end_stored=len(ends),
    )


def test_sigterm_lets_requests_in_flight_finish_within_the_shutdown_timeout(launch, tmp_path):
    worker = launch("sim", ["--time-scale", "0.05"])  # 8 tokens: about a second
    db = f"sqlite:///{tmp_path / 'graceful.db'}"
    serve = launch("serve", ["--worker", worker, "--db", db, "--shutdown-timeout", "300"]).ready()
    n = 10
    got = asyncio.run(_sigterm_with_requests(serve, n, max_tokens=8))
    assert serve.proc.wait(300) in (0, -signal.SIGTERM)
    assert got["late"][0][0] == 503
    assert all(status == 200 for status, _ in got["plain"])
    assert all(text.rstrip().endswith("data: [DONE]") for _, text in got["streams"])
    assert all("event: message_stop" in text for _, text in got["messages"])
    ends = _llm_ends(db)
    assert len(ends) == 3 * n and set(ends.values()) == {"ok"}
    reliability(scenario="SIGTERM, requests within --shutdown-timeout", sent=3 * n + 1, completed=3 * n, refused_503=1)


# -- 4. kill -9 and restart on the same store -------------------------------------------------------


def test_kill_9_and_restart_on_the_same_store_brings_every_program_back_to_its_worker(launch, store_url):
    """Before: 51 known programs became 0 after a restart. Now: each program not ended comes
    back with its worker, tier and open tool call, and its next request goes to that worker; a
    program whose worker is no longer configured comes back homeless."""
    workers = [launch("sim", ["--time-scale", "20"]), launch("sim", ["--time-scale", "20"])]
    args = ["--db", store_url, *(a for w in workers for a in ("--worker", w))]
    serve = launch("serve", args).ready()
    programs = [f"d-{i}" for i in range(8)]
    now = time.time()
    for pid in programs:
        r = httpx.post(serve.url + "/v1/chat/completions", json=_chat(pid, 4), timeout=60)
        assert r.status_code == 200
    tools = [
        {"type": "tool.start", "ts": now + 1, "program_id": pid, "call_id": f"{pid}-t", "tool": "pytest"} for pid in programs
    ]
    ended = {"type": "program.end", "ts": now + 2, "program_id": "d-7", "status": "ok"}
    assert httpx.post(serve.url + "/v1/events", json=[*tools, ended]).json()["accepted"] == 9
    before = {p["program_id"]: p for p in httpx.get(serve.url + "/v1/programs").json()}
    assert set(before) == set(programs[:7]) and {p["worker"] for p in before.values()} <= set(workers)

    def stored() -> bool:
        with SessionStore(store_url) as store:
            return len([e for e in store.events() if e["type"] in ("tool.start", "program.end")]) == 9

    assert wait_until(stored, timeout=60)
    serve.proc.send_signal(signal.SIGKILL)
    serve.proc.wait()

    again = launch("serve", args).ready()
    after = {p["program_id"]: p for p in httpx.get(again.url + "/v1/programs").json()}
    assert set(after) == set(before)
    for pid, p in after.items():
        assert (p["worker"], p["tier"], p["phase"]) == (before[pid]["worker"], "gpu", "acting")
        assert p["tool"]["call_id"] == f"{pid}-t" and p["readiness_source"] == before[pid]["readiness_source"]
    assert httpx.get(again.url + "/v1/programs/d-7").status_code == 404
    for pid in programs[:7]:
        assert httpx.post(again.url + "/v1/chat/completions", json=_chat(pid, 4), timeout=60).status_code == 200

    def served_at_home() -> bool:  # the second llm.end of each program names its worker
        with SessionStore(store_url) as store:
            ends = [e for e in store.events() if e["type"] == "llm.end" and e["program_id"] in before]
        return len(ends) == 14 and all(e.get("worker") == before[e["program_id"]]["worker"] for e in ends)

    assert wait_until(served_at_home, timeout=60)
    again.proc.send_signal(signal.SIGKILL)
    again.proc.wait()

    gone = workers[1]
    third = launch("serve", ["--db", store_url, "--worker", workers[0]]).ready()
    last = {p["program_id"]: p for p in httpx.get(third.url + "/v1/programs").json()}
    assert set(last) == set(before)
    homeless = sum(p["worker"] == gone for p in before.values())
    assert homeless > 0  # placement spread them over both workers
    assert f"7 programs restored from the store ({homeless} without a configured worker)" in third.stderr()
    assert all(p["worker"] == workers[0] for p in last.values())  # the homeless ones placed by the next step
    reliability(scenario="kill -9, restart on the same store", programs=7, restored=len(after), at_their_worker=len(after))


# -- 5. a re-sent batch ------------------------------------------------------------------------------


def test_a_batch_sent_three_times_counts_once_in_the_live_statistics_and_the_store(launch, store_url):
    """Before: n=3 in /v1/stats/tools and n=1 in the store. Now: n=1 in both."""
    serve = launch("serve", ["--db", store_url]).ready()
    batch = events_for("resent", 1, ts=time.time())
    answers = [httpx.post(serve.url + "/v1/events", json=batch).json() for _ in range(3)]
    assert [(a["accepted"], a["duplicates"]) for a in answers] == [(2, 0), (2, 2), (2, 2)]
    live = {r["tool"]: r["n"] for r in httpx.get(serve.url + "/v1/stats/tools").json()["tools"] if not r.get("signature")}
    assert live["pytest"] == 1

    def in_store() -> bool:
        with SessionStore(store_url) as store:
            stats = store.tool_stats("pytest")
        return stats is not None and stats.n == 1

    assert wait_until(in_store, timeout=30)
    assert "maitred_duplicate_events_total 4.0" in httpx.get(serve.url + "/metrics").text


def test_restore_makes_programs_of_a_worker_no_longer_configured_homeless():
    from maitred.events import LLMEnd, LLMStart, ToolEnd, ToolStart
    from maitred.runtime.records import WorkerState
    from maitred.runtime.state import RuntimeState

    state = RuntimeState([WorkerState("http://a", gpu_tokens=1000)])
    events = []
    for pid, worker in (("kept", "http://a"), ("gone", "http://b")):
        events += [
            LLMStart(ts=1.0, program_id=pid, request_id="r"),
            LLMEnd(ts=2.0, program_id=pid, request_id="r", prompt_tokens=90, completion_tokens=10, worker=worker),
            ToolStart(ts=2.5, program_id=pid, call_id="c0", tool="pytest"),
            ToolEnd(ts=2.8, program_id=pid, call_id="c0", status="ok"),
            ToolStart(ts=3.0, program_id=pid, call_id="c", tool="pytest"),
        ]
    assert sorted(state.restore(events)) == ["gone", "kept"]
    kept, gone = state.programs["kept"], state.programs["gone"]
    assert (kept.home_worker, kept.tier.value, kept.context_tokens, kept.tool and kept.tool.call_id) == (
        "http://a",
        "gpu",
        100,
        "c",
    )
    assert (gone.home_worker, gone.tier.value, gone.residency) == (None, "waiting", {})
    assert state.history.overall.n == 0  # the tool history comes from the store's statistics, not twice
