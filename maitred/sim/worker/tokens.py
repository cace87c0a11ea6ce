"""How the simulated worker turns a request into tokens, and text back out of tokens.

One token per word or run of punctuation (the regex ``\\w+|[^\\w\\s]+``, which is what the
``Whitespace`` pre-tokenizer of the word-level ``tokenizer.json`` shipped in
``assets/sim-model`` splits on), so counts are deterministic, need no model files, and any
client can predict them. A token's id is the CRC-32 of its text: equal words are equal tokens
wherever they appear, which is all a prefix cache needs. ``/generate`` with ``input_ids`` uses
the ids as given.

Chat messages are rendered ChatML-style: each message is ``<|im_start|>`` + role + content +
``<|im_end|>`` (three tokens of overhead), tool definitions form a block right after the
leading system messages, and the prompt ends with ``<|im_start|> assistant``. The leading
system messages and the tool block are the *agent prefix*: programs of the same agent share
it, as in the simulator's engine model. What the model generates (content words, then
``<|im_end|>`` when it stops on its own) is exactly what the next turn's rendering of that
assistant message contains, so a program's next prompt extends its previous prompt plus
output token for token, as with a real chat template.
"""

import json
import re
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WORD = re.compile(r"\w+|[^\w\s]+")
IM_START = 1
IM_END = 2
#: Words the double "generates": deterministic, one token each, nothing that reads as advice.
VOCAB = ("sim", "token", "alpha", "beta", "gamma", "delta", "step", "done", "ok", "value", "next", "plan")


class PromptError(ValueError):
    """A request whose prompt cannot be read; the message names the field."""


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8")) + 3  # 0..2 are reserved for the special tokens


_PREFIX_ROLES = frozenset(token_id(role) for role in ("system", "developer", "tools"))


def tokenize(text: str) -> list[int]:
    return list(_tokenize(text))


class _TokenCache:
    """Token ids of recently seen texts, least recently used out first, bounded by the tokens it
    holds (not by entries: one tool output can be a hundred thousand tokens)."""

    def __init__(self, max_tokens: int) -> None:
        self._entries: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._tokens = 0
        self._max = max_tokens

    def __call__(self, text: str) -> tuple[int, ...]:
        ids = self._entries.get(text)
        if ids is not None:
            self._entries.move_to_end(text)
            return ids
        ids = tuple(token_id(p) for p in WORD.findall(text))
        if len(ids) <= self._max:
            self._entries[text] = ids
            self._tokens += len(ids)
            while self._tokens > self._max:
                self._tokens -= len(self._entries.popitem(last=False)[1])
        return ids


#: Memoised: agents resend their whole history every step, so most messages were seen before.
_tokenize = _TokenCache(max_tokens=2_000_000)


def count_tokens(text: str) -> int:
    return sum(1 for _ in WORD.finditer(text))


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    prefix: int  # leading tokens shared by every program of the same agent
    agent: str  # key of that shared prefix ("" when there is none)


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise PromptError(f"{where}[{i}]: expected an object")
            if part.get("type") == "text" or "text" in part:
                text = part.get("text")
                if not isinstance(text, str):
                    raise PromptError(f"{where}[{i}].text: expected a string")
                parts.append(text)
        return " ".join(parts)
    raise PromptError(f"{where}: expected a string or a list of content parts")


def _tool_call_text(call: Any, where: str) -> str:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise PromptError(f"{where}: expected an object with a 'function'")
    function = call["function"]
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, sort_keys=True)
    return f"{function.get('name', '')} {arguments}"


def message_body(message: Mapping[str, Any], where: str) -> list[int]:
    """The tokens between ``<|im_start|> role`` and ``<|im_end|>``."""
    ids = list(_tokenize(_content_text(message.get("content"), where + ".content")))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise PromptError(f"{where}.tool_calls: expected a list")
    for j, call in enumerate(calls):
        ids += _tokenize(_tool_call_text(call, f"{where}.tool_calls[{j}]"))
    return ids


def render_chat(messages: Any, tools: Any = None, *, generation_prompt: bool = True) -> Prompt:
    """The prompt of a chat request (``generation_prompt``: ending with ``<|im_start|> assistant``,
    as for a completion; without it, the messages alone, a prefix of any continuation)."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages: expected a non-empty list")
    ids: list[int] = []
    prefix: int | None = None
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise PromptError(f"{where}: expected an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise PromptError(f"{where}.role: expected a string")
        if prefix is None and role not in ("system", "developer"):
            prefix = _close_prefix(ids, tools)
        ids.append(IM_START)
        ids.append(token_id(role))
        ids += message_body(message, where)
        ids.append(IM_END)
    if prefix is None:
        prefix = _close_prefix(ids, tools)
    if generation_prompt:
        ids += [IM_START, token_id("assistant")]
    return Prompt(ids, prefix, _agent(ids, prefix))


def _agent(ids: list[int], prefix: int) -> str:
    return f"a{zlib.crc32(repr(ids[:prefix]).encode()):08x}" if prefix else ""


def _chat_prefix(ids: list[int]) -> int:
    """Length of the agent prefix of ids rendered by ``render_chat`` (0 for any other ids): so a
    warmup sent as ``input_ids`` (from ``/v1/tokenize``) shares the agent's prefix and continues
    into the chat request that follows it."""
    end = 0
    while end + 1 < len(ids) and ids[end] == IM_START and ids[end + 1] in _PREFIX_ROLES:
        try:
            end = ids.index(IM_END, end + 2) + 1
        except ValueError:
            return 0
    return end


def _close_prefix(ids: list[int], tools: Any) -> int:
    """Append the tool block (if any) after the system messages; the prefix ends there."""
    if tools:
        if not isinstance(tools, list):
            raise PromptError("tools: expected a list")
        ids += [IM_START, token_id("tools"), *tokenize(json.dumps(tools, sort_keys=True)), IM_END]
    return len(ids)


def render_text(text: Any, field: str = "prompt") -> Prompt:
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if not isinstance(text, str):
        raise PromptError(f"{field}: expected a string")
    return Prompt(tokenize(text), 0, "")


def render_ids(ids: Any, field: str = "input_ids") -> Prompt:
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise PromptError(f"{field}: expected a non-empty list of non-negative integers")
    ids = list(ids)
    prefix = _chat_prefix(ids)
    return Prompt(ids, prefix, _agent(ids, prefix))


def words(seed: int, n: int) -> list[str]:
    """``n`` deterministic filler words for a reply."""
    return [VOCAB[(seed + 7 * i) % len(VOCAB)] for i in range(n)]


def seq_seed(ids: Sequence[int]) -> int:
    return zlib.crc32(repr(ids[-64:]).encode())
