"""W3C trace context through the gateway: a real gateway on 127.0.0.1 in front of a simulated
SGLang worker, a client sending ``traceparent`` / ``tracestate``: the worker receives them, and the
request's ``llm.start`` / ``llm.end`` in the store carry the caller's trace id."""

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.loop import LiveConfig
from maitred.gateway.tracecontext import trace_context
from maitred.harness.background import BackgroundServer
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from maitred.storage import SessionStore
from tests.helpers import wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def through_gateway(tmp_path) -> Iterator[tuple[str, Any, str]]:
    """A gateway (its URL), its simulated worker's state, and the gateway's store URL."""
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    with ExitStack() as stack:
        worker = stack.enter_context(BackgroundServer(create_app(SimWorkerConfig(gpu_tokens=50_000, time_scale=50))))
        runtime = LiveConfig(tick_s=0.2, poll_s=0.2)
        gateway = build_app(ServeConfig([worker.url], db_url=db_url, runtime=runtime, wait_for_workers_s=10))
        server = stack.enter_context(BackgroundServer(gateway.app))
        yield server.url, worker.app.state.sim, db_url


def chat(program_id: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim", "program_id": program_id, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **extra}


def llm_events(db_url: str, program_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def both() -> bool:
        nonlocal found
        with SessionStore(db_url) as store:
            found = [e for e in store.events(program_id) if e["type"].startswith("llm.")]
        return len(found) == 2

    assert wait_until(both, timeout=20), found
    return found


@pytest.mark.parametrize("stream", [False, True])
def test_a_callers_trace_context_reaches_the_worker_and_its_trace_id_the_llm_events(through_gateway, stream):
    url, sim, db_url = through_gateway
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"}
    program = f"traced-{stream}"
    response = httpx.post(f"{url}/v1/chat/completions", json=chat(program, stream=stream), headers=headers, timeout=30)
    assert response.status_code == 200
    assert list(sim.trace_contexts) == [("/v1/chat/completions", TRACEPARENT)]
    start, end = llm_events(db_url, program)
    assert (start["type"], start["trace_id"], end["type"], end["trace_id"]) == ("llm.start", TRACE_ID, "llm.end", TRACE_ID)


def test_a_request_without_or_with_an_invalid_traceparent_is_served_and_passes_none_on(through_gateway):
    url, sim, db_url = through_gateway
    for program, headers in (("plain", {}), ("invalid", {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"})):
        response = httpx.post(f"{url}/v1/chat/completions", json=chat(program), headers=headers, timeout=30)
        assert response.status_code == 200
        assert all("trace_id" not in e for e in llm_events(db_url, program))
    assert list(sim.trace_contexts) == []


@pytest.mark.parametrize(
    ("traceparent", "trace_id"),
    [
        (TRACEPARENT, TRACE_ID),
        (f"01-{TRACE_ID}-00f067aa0ba902b7-01-later-field", TRACE_ID),  # a later version may add fields
        (f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra", None),  # version 00 may not
        (f"ff-{TRACE_ID}-00f067aa0ba902b7-01", None),
        (f"00-{TRACE_ID}-0000000000000000-01", None),
        (f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01", None),
        ("not a traceparent", None),
    ],
)
def test_only_a_traceparent_the_w3c_format_allows_is_read(traceparent, trace_id):
    found = trace_context({"traceparent": traceparent, "tracestate": "a=1"})
    assert (found.trace_id if found else None) == trace_id
    if found is not None:
        assert dict(found.headers) == {"traceparent": traceparent, "tracestate": "a=1"}
