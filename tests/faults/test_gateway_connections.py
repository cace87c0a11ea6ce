"""Clients that hold connections without finishing a request (slowloris): a real ``maitred
serve`` process on 127.0.0.1 and raw sockets that drip their headers or body a byte at a time."""

import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx

from maitred.bind import wait_http
from maitred.harness.background import free_port

FD_LIMIT = 256


@contextmanager
def gateway(*flags: str, fd_limit: int | None = None) -> Iterator[str]:
    """``maitred serve`` without workers (telemetry only), optionally under a descriptor limit."""
    port = free_port()

    def limit() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    command = [sys.executable, "-m", "maitred", "serve", "--port", str(port), "--no-db", "--log-level", "warning", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen(command, preexec_fn=limit, env=env, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", timeout_s=60, process=process)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _open(url: str, first: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    if first:
        s.sendall(first)
    return s


class Dripper:
    """Sends one byte every ``every_s`` on ``sock`` until the server closes it; keeps what came back."""

    def __init__(self, sock: socket.socket, every_s: float = 0.1) -> None:
        self.sock, self.every_s, self.answer = sock, every_s, b""
        self.closed = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        self.sock.settimeout(self.every_s)
        try:
            while True:
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    self.sock.sendall(b"x")  # one more byte of a header value, or of the body
                    continue
                if not data:
                    break
                self.answer += data
        except OSError:
            pass
        self.closed.set()


HEAD = b"POST /v1/events HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"


def test_connections_that_drip_headers_or_a_body_are_answered_408_and_closed():
    with gateway("--header-timeout", "1", "--body-timeout", "1") as url, ExitStack() as stack:
        silent = stack.enter_context(_open(url, b""))
        drips = [
            Dripper(stack.enter_context(_open(url, HEAD + b"x-slow: "))),  # headers, never finished
            Dripper(stack.enter_context(_open(url, b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: "))),
            Dripper(stack.enter_context(_open(url, HEAD + b"content-length: 1000000\r\n\r\n["))),  # a body, dripped
        ]
        silent.settimeout(60)
        answer = b""
        while chunk := silent.recv(65536):
            answer += chunk
        assert all(d.closed.wait(60) for d in drips)  # every one closed by the gateway
        answers = [answer, *(d.answer for d in drips)]
        assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 408 Request Timeout"] * 4
        assert b"--header-timeout" in answers[1] and b"--body-timeout" in answers[3]
        assert httpx.get(url + "/healthz").status_code == 200


def test_many_slow_clients_do_not_lock_new_clients_out_of_a_gateway_short_of_descriptors():
    """300 connections each holding half a request, against a gateway limited to 256 descriptors
    (so to 64 client connections by default): new clients are still served, every time."""
    with gateway(fd_limit=FD_LIMIT) as url, ExitStack() as stack:
        for _ in range(300):
            stack.enter_context(_open(url, HEAD + b"x-slow: 1"))
        served = [httpx.get(url + "/healthz", timeout=30).status_code for _ in range(5)]
        with httpx.Client(base_url=url, timeout=30) as client:
            events = client.post("/v1/events", json=[{"type": "program.start", "ts": 1.0, "program_id": "p"}])
    assert served == [200] * 5
    assert events.status_code == 200 and events.json()["accepted"] == 1
