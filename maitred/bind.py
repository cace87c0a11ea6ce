"""Starting a local server: whether its address can be listened on, checked before it starts
(uvicorn reports a taken port as a multi-line log and its own exit status, after the app has been
built), how long it keeps idle connections, and waiting until it answers.

Below the gateway, the simulated worker and the harnesses, which all start servers, so none of
them imports another for these.
"""

import shlex
import socket
import subprocess
import time
from typing import Any

import httpx

#: Longer than HTTP clients keep idle connections (httpx: 5 s), so a client never sends on a
#: connection the server is just closing.
KEEP_ALIVE_S = 30


def check_bindable(host: str, port: int) -> None:
    """Raise ``ValueError`` naming the flags when ``host:port`` cannot be listened on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ValueError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None


def wait_http(url: str, *, timeout_s: float = 30.0, process: subprocess.Popen[Any] | None = None) -> None:
    """Poll ``url`` until it answers 2xx; raise if ``timeout_s`` passes or ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            args = process.args
            command = shlex.join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
            raise RuntimeError(
                f"{command} exited with status {process.returncode} before {url} answered (its own output, above, says why)"
            )
        try:
            if httpx.get(url, timeout=1.0).is_success:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")
        time.sleep(0.05)
