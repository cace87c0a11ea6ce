"""Headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol, for the
pages the tests check and the screenshots in ``docs/observability.md``.

A page such as the Perfetto UI or Phoenix's trace view draws after scripts run and data loads,
so a one-shot ``chromium --screenshot`` catches a spinner: this waits until the page's text
shows what the caller expects, then reads the text or captures the window. The protocol is
spoken with ``websockets`` (no browser-automation package to pin to a Chromium build).
Where Chromium is not installed the callers skip with one line, except in CI, which installs it.
"""

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import websockets

from maitred.harness.background import free_port

WIDTH, HEIGHT = 1600, 900


def chromium() -> str | None:
    """The Chromium binary, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: ``text()`` is what a reader sees, ``wait_for`` polls it, ``screenshot`` saves a PNG."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        await self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(await self._ws.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def text(self) -> str:
        result = await self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''")
        return str(result["result"].get("value", ""))

    async def wait_for(self, ready: Callable[[str], bool], *, timeout_s: float = 60.0) -> str:
        """The page's text once ``ready`` accepts it; TimeoutError with the last text otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = await self.text()
            if ready(text):
                return text
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never showed what was expected; it shows: {text[:500]!r}")
            await asyncio.sleep(0.5)

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextmanager
def browser() -> Iterator[Callable[[str, Callable[[Page], Any]], Any]]:
    """A headless Chromium; yields ``visit(url, body)``, which opens ``url`` in a new tab and
    runs the coroutine function ``body(page)`` to completion, returning what it returns."""
    binary = chromium()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="maitred-chromium-") as profile:
        process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--remote-debugging-port={port}",
                "--remote-debugging-address=127.0.0.1",
                f"--user-data-dir={profile}",
                f"--window-size={WIDTH},{HEIGHT}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # its own process group: Chromium's renderer, GPU and crash handler processes go with
            # it, instead of writing into the profile while it is being removed
            start_new_session=True,
        )
        try:
            _wait_devtools(port, process)

            def visit(url: str, body: Callable[[Page], Any]) -> Any:
                return asyncio.run(_visit(port, url, body))

            yield visit
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _wait_devtools(port: int, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode} before it answered")
        try:
            httpx.get(f"http://127.0.0.1:{port}/json/version", timeout=2).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"chromium's DevTools port {port} never answered") from None
            time.sleep(0.2)


async def _visit(port: int, url: str, body: Callable[[Page], Any]) -> Any:
    async with httpx.AsyncClient() as client:
        tab = (await client.put(f"http://127.0.0.1:{port}/json/new?{url}", timeout=10)).json()
    async with websockets.connect(tab["webSocketDebuggerUrl"], max_size=None) as ws:
        page = Page(ws)
        await page.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        return await body(page)


def require_chromium() -> None:
    """Skip (fail in CI, which installs it) where Chromium is missing."""
    import pytest

    if chromium() is None:
        message = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
