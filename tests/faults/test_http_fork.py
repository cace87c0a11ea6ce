"""A process that forks after it has sent events to a runtime keeps sending in the child, on a
TCP connection of its own, never on the keep-alive connection the parent's client pooled.

A pooled connection copied by ``fork`` is one TCP stream written by two processes: their
requests interleave on the wire and either may read the other's response. A real HTTP/1.1
keep-alive server (uvicorn) records the client's port of every POST, so the test sees which
connection each process's events came on: the parent sends (its connection is now pooled),
forks, the child sends and exits, the parent sends again. Every warning either side logs is a
failure, as in tests/faults/test_fork.py.
"""

import json
import logging
import os
from collections import Counter
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import maitred
from maitred.harness.background import BackgroundServer
from maitred.middleware import EmitterSettings
from tests.helpers import Warnings, assert_nothing_lost_across_fork, child_report, emit_calls

CALLS = 200


class EventRecorder:
    """An ASGI app taking POST /v1/events: for each request, the client's port (one per TCP
    connection) and the events it carried."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, list[dict[str, Any]]]] = []
        self.app = Starlette(routes=[Route("/v1/events", self.events, methods=["POST"])])

    async def events(self, request: Request) -> JSONResponse:
        events = json.loads(await request.body())
        assert request.client is not None
        self.requests.append((request.client.port, events))
        return JSONResponse({"accepted": len(events)})

    def ports(self, side: str) -> set[int]:
        """The client ports of the requests carrying events of programs named ``side-...``."""
        return {port for port, events in self.requests if any(e["program_id"].startswith(side) for e in events)}


def child(report_w: int) -> None:
    """The forked child: send through the telemetry it inherited, close it as an exiting process
    does, report, and leave without running the parent's test machinery."""
    code = 1
    try:
        warnings = Warnings()
        logging.getLogger("maitred").addHandler(warnings)
        emitted = emit_calls("child", CALLS)
        flushed = maitred.flush(timeout=30)
        (stats,) = maitred.stats()
        figures = {
            "emitted": emitted,
            "flushed": flushed,
            "delivered": stats.delivered,
            "dropped": stats.dropped,
            "last_error": stats.last_error,
            "shutdown": maitred.shutdown(timeout=30),
            "warnings": warnings.messages,
        }
        os.write(report_w, json.dumps(figures).encode())
        code = 0
    finally:
        os._exit(code)


@pytest.mark.timeout(120)  # a guard against a hung child, not a speed requirement
def test_a_forked_child_sends_on_its_own_connection_and_every_event_arrives_once():
    recorder = EventRecorder()
    warnings = Warnings()
    logging.getLogger("maitred").addHandler(warnings)
    with BackgroundServer(recorder.app) as server:
        try:
            maitred.configure(runtime_url=server.url, settings=EmitterSettings(interval_s=0.01))
            emitted = emit_calls("parent-before", CALLS)
            assert maitred.flush(timeout=30) is True  # the parent's keep-alive connection is pooled
            report_r, report_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                child(report_w)
            os.close(report_w)
            in_child = child_report(pid, report_r)
            emitted += emit_calls("parent-after", CALLS)
            assert maitred.flush(timeout=30) is True
            (stats,) = maitred.stats()
        finally:
            logging.getLogger("maitred").removeHandler(warnings)
            maitred.shutdown(timeout=30)
    assert_nothing_lost_across_fork(in_child, warnings.messages, stats, emitted)
    assert (in_child["flushed"], in_child["shutdown"]) == (True, True)
    received = Counter((e["type"], e["program_id"], e.get("call_id")) for _, events in recorder.requests for e in events)
    assert set(received.values()) == {1}  # no event twice
    per_program = Counter(program_id for _, program_id, _ in received)
    assert per_program == dict.fromkeys(["parent-before", "child", "parent-after"], 2 * CALLS + 2)
    assert recorder.ports("child") and recorder.ports("parent")
    assert recorder.ports("child").isdisjoint(recorder.ports("parent")), "the child sent on the parent's connection"
