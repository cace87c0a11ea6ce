"""A scripted Anthropic Messages server, so the real Claude Code CLI runs headless on 127.0.0.1.

Claude Code decides what to run from the model's answers; this server gives those answers from
a script instead of a model. A conversation picks its script by a marker in its first user
message (``SCRIPT:<name>``): the main session's prompt names one, and an ``Agent`` call's
``prompt`` names the subagent's. The answer to a request is the script's entry at the number of
assistant turns the conversation already holds, so retries and parallel conversations answer
alike; past the end, or for requests that name no script (Claude Code's own side calls), a short
text ends the turn. Every request is kept (path, headers, body) for the tests to inspect.

Answers are streamed when the request asks (``stream: true``, as Claude Code does) in the
Messages API's event sequence: ``message_start``, per block ``content_block_start`` /
``content_block_delta`` / ``content_block_stop``, then ``message_delta`` (stop reason, usage)
and ``message_stop``.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_MARKER = re.compile(r"SCRIPT:([A-Za-z0-9_-]+)")


@dataclass(frozen=True)
class Tool:
    """One ``tool_use`` block the model asks for."""

    name: str
    input: Mapping[str, Any]


#: A script entry: the tool calls of one assistant turn (parallel when several), or its final text.
Turn = Sequence[Tool] | str


def bash(command: str, *, timeout_ms: int | None = None, background: bool = False) -> Tool:
    args: dict[str, Any] = {"command": command, "description": command[:40]}
    if timeout_ms is not None:
        args["timeout"] = timeout_ms
    if background:
        args["run_in_background"] = True
    return Tool("Bash", args)


def agent(script: str, *, kind: str = "general-purpose", background: bool = False) -> Tool:
    args: dict[str, Any] = {"description": f"run {script}", "prompt": f"SCRIPT:{script} go", "subagent_type": kind}
    if background:
        args["run_in_background"] = True
    return Tool("Agent", args)


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    script: str | None


@dataclass
class AnthropicScript:
    """The server: ``with AnthropicScript({"main": [...]}) as api: ... api.url``."""

    scripts: Mapping[str, Sequence[Turn]]
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> AnthropicScript:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def scripted(self, name: str) -> list[Seen]:
        """The model requests of one script's conversations."""
        return [s for s in self.seen if s.script == name]

    def answer(self, body: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """(script name, the Messages API response) for one request body."""
        messages = body.get("messages") or []
        name = _script_of(messages)
        turns = self.scripts.get(name or "", ())
        done = sum(1 for m in messages if m.get("role") == "assistant")
        turn: Turn = turns[done] if done < len(turns) else "done"
        with self._lock:
            n = next(self._ids)
        if isinstance(turn, str):
            content: list[dict[str, Any]] = [{"type": "text", "text": turn}]
            stop = "end_turn"
        else:
            content = [
                {"type": "tool_use", "id": f"toolu_{n:04d}_{i}", "name": t.name, "input": dict(t.input)} for i, t in enumerate(turn)
            ]
            stop = "tool_use"
        message = {
            "id": f"msg_{n:06d}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "scripted"),
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 100 + 10 * done, "output_tokens": 12, "cache_read_input_tokens": 50 * done},
        }
        return name, message


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _script_of(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in messages:
        if message.get("role") == "user":
            found = _MARKER.search(_text_of(message.get("content")))
            return found.group(1) if found else None
    return None


def _sse(message: Mapping[str, Any]) -> bytes:
    """The streamed form of one complete message."""
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": opened}),
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def _handler(server: AnthropicScript) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_HEAD(self) -> None:
            self._send(200, b"")

        def do_GET(self) -> None:
            self._send(200, json.dumps({"data": [], "has_more": False}).encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = {}
            path = self.path.split("?", 1)[0]
            headers = {k.lower(): v for k, v in self.headers.items()}
            if path.endswith("/count_tokens"):
                server.seen.append(Seen(path, headers, body, None))
                self._send(200, b'{"input_tokens": 100}')
                return
            name, message = server.answer(body)
            server.seen.append(Seen(path, headers, body, name))
            if body.get("stream"):
                self._send(200, _sse(message), "text/event-stream")
            else:
                self._send(200, json.dumps(message).encode())

        def log_message(self, *args: object) -> None:
            pass

    return Handler
