"""What a worker's answer says about the prompt: tokens, cached tokens (fed back into the state).

Two answer shapes: OpenAI's ``usage`` (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens`` with SGLang's ``--enable-cache-report``) and SGLang's
``/generate`` ``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``). A
stream carries them in its last chunks; ``SSEUsage`` finds them while the chunks pass through
untouched, parsing only the events that can hold them.
"""

import re
from dataclasses import dataclass
from typing import Any

import orjson

from maitred.gateway.sglang.client import WorkerProtocolError, cached_tokens

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_META = re.compile(rb'"meta_info"\s*:\s*\{')


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of(body: Any) -> Usage:
    """Token counts of one answer (or one stream chunk); absent or malformed fields are None."""
    if not isinstance(body, dict):
        return Usage()
    source = body.get("usage")
    if not isinstance(source, dict):
        source = body.get("meta_info")
    if not isinstance(source, dict):
        return Usage()
    try:
        cached = cached_tokens(body)
    except WorkerProtocolError:
        cached = None
    return Usage(_int(source.get("prompt_tokens")), _int(source.get("completion_tokens")), cached)


#: Characters per token assumed until a program's own ratio is known (English text and code).
CHARS_PER_TOKEN = 4.0


@dataclass(frozen=True, slots=True)
class PromptSize:
    """How big a prompt is before the worker tokenises it: ``tokens`` when the request gives
    token ids, else its length in characters (message contents and a small per-message
    overhead, counted as characters)."""

    chars: int = 0
    tokens: int | None = None

    def estimate(self, chars_per_token: float | None) -> int:
        """Tokens, from the program's own characters-per-token ratio when one was learned
        (its previous answers), else ``CHARS_PER_TOKEN``."""
        if self.tokens is not None:
            return self.tokens
        return round(self.chars / (chars_per_token or CHARS_PER_TOKEN))


def prompt_size(body: dict[str, Any]) -> PromptSize | None:
    ids = body.get("input_ids")
    if isinstance(ids, list):
        return PromptSize(tokens=len(ids))
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = 0
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                chars += (len(content) if isinstance(content, str) else len(str(content or ""))) + 16
        return PromptSize(chars=chars)
    for key in ("prompt", "text"):
        value = body.get(key)
        if isinstance(value, str):
            return PromptSize(chars=len(value))
        if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
            return PromptSize(tokens=len(value))
    return None


def warm_prompt(body: dict[str, Any]) -> str | list[int] | tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | None:
    """What a prefill-only warmup can replay of a request: the text or token ids of a text
    request, or a chat request's messages and tools, which the worker renders with its own chat
    template (SGLang's ``/v1/tokenize``) when the warmup is sent (``/generate`` takes no messages)."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages):
        tools = body.get("tools")
        return messages, tools if isinstance(tools, list) and all(isinstance(t, dict) for t in tools) else None
    for key in ("input_ids", "prompt", "text"):
        value = body.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return value
    return None


class SSEUsage:
    """Watches a server-sent-event stream for its usage while passing it through.

    ``drop_usage_only``: the gateway asked for usage the client did not (``stream_options``),
    so the usage-only chunk (``choices: []``) is taken out of what the client sees."""

    def __init__(self, *, drop_usage_only: bool) -> None:
        self.drop_usage_only = drop_usage_only
        self.usage = Usage()
        self._buffer = b""
        self._last_meta: bytes | None = None

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward for ``chunk`` (whole events only when something may be dropped)."""
        if not self.drop_usage_only:
            self._scan(chunk)
            return chunk
        self._buffer += chunk
        out = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            event, self._buffer = self._buffer[: end + 2], self._buffer[end + 2 :]
            if not self._usage_only(event):
                out.append(event)
        return b"".join(out)

    def settle(self) -> Usage:
        """The usage as far as the stream has told it (``/generate`` streams repeat it in every
        event; the last one counts)."""
        if self._last_meta is not None:
            self._take(self._last_meta)
            self._last_meta = None
        return self.usage

    def finish(self) -> bytes:
        """What is left to forward at the end of the stream; settles ``usage``."""
        self.settle()
        rest, self._buffer = self._buffer, b""
        if rest and self.drop_usage_only and self._usage_only(rest):
            return b""
        return rest

    def _scan(self, chunk: bytes) -> None:
        # Events may split across chunks; keep the tail so a split event is still seen whole.
        data = self._buffer + chunk
        for event in data.split(b"\n\n")[:-1]:
            if _USAGE.search(event):
                self._take(event)
            elif _META.search(event):
                self._last_meta = event
        self._buffer = data[data.rfind(b"\n\n") + 2 :] if b"\n\n" in data else data[-65536:]

    def _usage_only(self, event: bytes) -> bool:
        if _META.search(event):
            self._last_meta = event
            return False
        if not _USAGE.search(event):
            return False
        body = self._take(event)
        return isinstance(body, dict) and body.get("choices") == []

    def _take(self, event: bytes) -> Any:
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                try:
                    body = orjson.loads(line[5:].strip())
                except orjson.JSONDecodeError:
                    return None
                found = usage_of(body)
                if found.prompt_tokens is not None or found.completion_tokens is not None:
                    self.usage = found
                return body
        return None
