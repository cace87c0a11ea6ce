"""Run an ASGI app on 127.0.0.1 in a background thread, or a command as a child process, and
wait until it answers: what the demo, the benchmarks and the end-to-end tests start their
gateways and simulated workers with (real sockets, real HTTP; no in-process shortcuts).

``wait_http`` lives in ``maitred.bind``, because the gateway's SGLang launcher waits for its
children with it and the gateway must not import a harness; it is offered here too, beside the
servers it waits for."""

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from maitred.bind import KEEP_ALIVE_S, wait_http

__all__ = ["BackgroundServer", "free_port", "wait_http"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class BackgroundServer:
    """``app`` served by uvicorn on its own event loop in a daemon thread."""

    app: Any
    host: str = "127.0.0.1"
    port: int = 0
    log_level: str = "warning"
    server: uvicorn.Server = field(init=False)
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.port = self.port or free_port(self.host)
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            log_level=self.log_level,
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"server on {self.url} stopped while starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {self.url} did not start within {timeout_s:.0f} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
