"""What a worker's answer says about the prompt: tokens, cached tokens (fed back into the state).

Four answer shapes: OpenAI's chat and completion ``usage`` (``prompt_tokens``,
``completion_tokens``, ``prompt_tokens_details.cached_tokens`` with SGLang's
``--enable-cache-report``); SGLang's ``/generate`` ``meta_info`` (``prompt_tokens``,
``completion_tokens``, ``cached_tokens``); Anthropic's ``usage`` on ``/v1/messages``
(``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``); and OpenAI's Responses API
``usage`` (``input_tokens``, ``output_tokens``, ``input_tokens_details.cached_tokens``). A stream
carries them in its last events (Anthropic's in ``message_start.message.usage`` and
``message_delta.usage``, the Responses API's in ``response.completed``); ``SSEUsage`` finds them
while the chunks pass through untouched, parsing only the events that can hold them.

On ``/v1/messages`` SGLang reports ``input_tokens`` as the whole prompt, cached part included
(``cache_read_input_tokens`` is that part), where Anthropic's own API counts cache reads and
writes apart from ``input_tokens``. The workers are SGLang, so ``input_tokens`` is taken as the
prompt; adding the cache counts to it would count the cached prefix twice.
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
    if "usage" not in body:
        # Anthropic's message_start carries its usage in ``message``, Responses stream events in ``response``
        inner = body.get("message") if body.get("type") == "message_start" else body.get("response")
        body = inner if isinstance(inner, dict) else body
    source = body.get("usage")
    if isinstance(source, dict) and ("input_tokens" in source or "output_tokens" in source):
        return _input_output_usage(source)
    if not isinstance(source, dict):
        source = body.get("meta_info")
    if not isinstance(source, dict):
        return Usage()
    try:
        cached = cached_tokens(body)
    except WorkerProtocolError:
        cached = None
    return Usage(_int(source.get("prompt_tokens")), _int(source.get("completion_tokens")), cached)


def _input_output_usage(source: dict[str, Any]) -> Usage:
    """Anthropic's and the Responses API's usage (see the module's note on ``input_tokens``)."""
    cached = _int(source.get("cache_read_input_tokens"))
    details = source.get("input_tokens_details")
    if cached is None and isinstance(details, dict):
        cached = _int(details.get("cached_tokens"))
    return Usage(_int(source.get("input_tokens")), _int(source.get("output_tokens")), cached)


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


#: Characters counted for each message (its role and the chat template's markers).
MESSAGE_OVERHEAD_CHARS = 16


def _text_chars(value: Any) -> int:
    """Characters of the text in a message's content, in any of the shapes clients send: a
    string; a list of parts or blocks (OpenAI's ``text`` parts, Anthropic's ``text``,
    ``tool_use`` with its JSON ``input`` and ``tool_result`` with its own content, the Responses
    API's ``input_text`` items); an object with ``text``, ``content``, ``arguments`` or
    ``input``. Images and documents add nothing: their size in tokens is not in their bytes."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if not isinstance(value, dict):
        return 0
    chars = 0
    for key in ("text", "content", "name", "arguments", "output", "thinking"):
        chars += _text_chars(value.get(key))
    if isinstance(value.get("input"), dict):
        chars += len(orjson.dumps(value["input"]))
    if isinstance(value.get("tool_calls"), list):
        chars += len(orjson.dumps(value["tool_calls"]))
    return chars


def prompt_size(body: dict[str, Any]) -> PromptSize | None:
    """How big a request's prompt is: token ids counted as given; messages (chat and Anthropic,
    with Anthropic's ``system``), the Responses API's ``input`` and ``instructions``, and the tool
    definitions counted in characters."""
    ids = body.get("input_ids")
    if isinstance(ids, list):
        return PromptSize(tokens=len(ids))
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = body.get("input") if isinstance(body.get("input"), list) else None
    if isinstance(messages, list):
        chars = sum(_text_chars(m) + MESSAGE_OVERHEAD_CHARS for m in messages if isinstance(m, dict))
    elif isinstance(body.get("input"), str):
        chars = len(body["input"])
    else:
        chars = -1
    if chars >= 0:
        chars += _text_chars(body.get("system")) + _text_chars(body.get("instructions"))
        if isinstance(body.get("tools"), list):
            chars += len(orjson.dumps(body["tools"]))
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


def _fields(usage: Usage) -> tuple[int | None, int | None, int | None]:
    return usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens


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
        # Most chunks tell no usage: one search over the whole of them spares splitting them
        if _USAGE.search(data) or _META.search(data):
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
                    # A later event's counts win; one that leaves a count out keeps the earlier one
                    # (Anthropic's message_delta may give only output_tokens after message_start).
                    was = self.usage
                    self.usage = Usage(
                        *(new if new is not None else old for new, old in zip(_fields(found), _fields(was), strict=True))
                    )
                return body
        return None
