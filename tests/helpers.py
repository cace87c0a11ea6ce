"""Test doubles that are real parts: an in-memory sink and a real HTTP server on 127.0.0.1."""

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, text

import maitred
from maitred.events import Event


class ListSink:
    """Keeps every delivered event, in order (the emitter still runs its real thread)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def send(self, events: Sequence[Event]) -> int:
        self.events.extend(events)
        return 0

    def close(self) -> None:
        pass

    def of_type(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.TYPE == kind]


class EventServer:
    """A stdlib HTTP server that accepts POST /v1/events, failing the first ``fail_first``
    requests with 503 so retry behaviour can be observed."""

    def __init__(self, fail_first: int = 0, port: int = 0) -> None:
        self.bodies: list[list[dict]] = []
        self.headers: list[dict[str, str]] = []
        self.auth: list[str | None] = []
        self.fail_first = fail_first
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                server.requests += 1
                if server.requests <= server.fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                server.auth.append(self.headers.get("authorization"))
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                server.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"accepted": 0}')

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "EventServer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def events(self) -> list[dict]:
        return [e for body in self.bodies for e in body]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatedSink(ListSink):
    """Holds every send until ``gate`` is set; ``entered`` is set once a send is waiting, so a
    test knows the worker is busy without sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def send(self, events: Sequence[Event]) -> int:
        self.entered.set()
        self.gate.wait(30)
        return super().send(events)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 in front of a real server, that a test can take down
    (listener and every open connection closed: clients see a refused or reset connection)
    and bring back on the same port — an outage of a real database, without touching it."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def up(self) -> "TcpProxy":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, []
        for s in ([listener] if listener else []) + sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def passing(self) -> bool:
        """Whether bytes read now are forwarded (a subclass may swallow them instead)."""
        return True

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if self.passing():
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@contextmanager
def throwaway_schemas(url: str, prefix: str = "t") -> Iterator[Callable[[], str]]:
    """A maker of fresh PostgreSQL schemas on ``url`` (each a URL whose search_path is the new
    schema), all dropped at the end: tests never see each other's rows."""
    admin = create_engine(url)
    made: list[str] = []

    def make() -> str:
        schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        made.append(schema)
        sep = "&" if "?" in url else "?"
        return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"

    try:
        yield make
    finally:
        with admin.begin() as conn:
            for schema in made:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class Warnings(logging.Handler):
    """Every warning the ``maitred`` logger gives in this process, as text."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def emit_calls(program_id: str, calls: int) -> int:
    """``calls`` tool calls inside one program; returns the events that makes."""
    tool = maitred.tool(name="work")(lambda: None)
    with maitred.program(program_id):
        for _ in range(calls):
            tool()
    return 2 * calls + 2


def assert_nothing_lost_across_fork(in_child: dict[str, Any], parent_warnings: list[str], stats: Any, emitted: int) -> None:
    """Both sides of a fork delivered every event they emitted, dropped none and warned of
    nothing (``in_child``: the child's ``child_report``; ``stats``: the parent's emitter stats)."""
    assert (in_child["warnings"], parent_warnings) == ([], [])
    assert (in_child["delivered"], in_child["dropped"], in_child["last_error"]) == (in_child["emitted"], 0, None)
    assert (stats.delivered, stats.dropped, stats.last_error) == (emitted, 0, None)


def child_report(pid: int, report_r: int) -> dict[str, Any]:
    """What a forked child wrote on ``report_r`` (JSON) before exiting with status 0."""
    report = b"".join(iter(lambda: os.read(report_r, 65536), b""))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and report, "the child failed before reporting"
    figures: dict[str, Any] = json.loads(report)
    return figures
