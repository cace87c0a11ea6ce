"""Anthropic Messages and OpenAI Responses requests, as the chat request the worker serves.

SGLang serves ``/v1/messages`` by converting each request to a chat completion request
(``entrypoints/anthropic/serving.py``) and so does the simulated worker, with the same mapping,
so both endpoints render the same prompt tokens, share their prefix cache with chat requests and
get ``--script-tools`` for free: ``system`` (a string or text blocks) becomes the leading system
message; ``text`` blocks become text parts; an assistant's ``tool_use`` blocks become its
``tool_calls`` (``input`` as JSON arguments); a user's ``tool_result`` blocks become ``tool``
messages ahead of whatever text that user message also holds; ``image``, ``thinking`` and other
blocks add no text (the double has no vision and no reasoning); tools become functions with
``input_schema`` as their parameters; ``tool_choice`` ``auto``/``any``/``tool``/``none`` becomes
``auto``/``required``/that function/``none``.

The Responses API (``/v1/responses``, which OpenAI's Codex CLI uses) maps the same way:
``instructions`` is the system message, ``input`` a string (one user message) or a list of
items — messages (``input_text``/``output_text`` parts), ``function_call`` (an assistant's tool
call) and ``function_call_output`` (a tool message) — and flat ``function`` tools.

``max_tokens`` (``max_output_tokens``) is a cap here, not a target: Claude Code asks for 32,000
and a model stops well before. Under the double's usual reply length it is the length (and the
reply stops for it); above, the double gives its usual short reply.
"""

import json
from collections.abc import Mapping
from typing import Any

from maitred.sim.worker.replies import DEFAULT_CHAT_TOKENS
from maitred.sim.worker.tokens import PromptError

#: Anthropic's ``tool_choice.type`` as a chat request's ``tool_choice``.
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def _cap(body: Mapping[str, Any], name: str, *, required: bool) -> int | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PromptError(f"{name}: expected a positive integer, got {value!r}")
    return value if value < DEFAULT_CHAT_TOKENS else None


def _text_of(blocks: Any, where: str) -> str:
    """The text of a string or of a list of blocks (only ``text`` blocks count)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    if not isinstance(blocks, list):
        raise PromptError(f"{where}: expected a string or a list of content blocks")
    return "\n".join(b["text"] for b in blocks if isinstance(b, Mapping) and isinstance(b.get("text"), str))


def _anthropic_message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant", "system"):
        raise PromptError(f"{where}.role: expected 'user', 'assistant' or 'system'")
    role, content = message["role"], message.get("content")
    if role == "system":  # a system message mid-conversation (Claude Code's per-turn control beta)
        return [{"role": "system", "content": _text_of(content, f"{where}.content")}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise PromptError(f"{where}.content: expected a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        if not isinstance(block, Mapping):
            raise PromptError(f"{where}.content[{j}]: expected a content block object")
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            texts.append({"type": "text", "text": _text_of([block], f"{where}.content[{j}]")})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                {
                    "id": block.get("id") or "",
                    "type": "function",
                    "function": {"name": block.get("name") or "", "arguments": arguments},
                }
            )
        elif kind == "tool_result":
            text = _text_of(block.get("content"), f"{where}.content[{j}].content")
            if role == "user":
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "", "content": text})
            else:
                texts.append({"type": "text", "text": f"Tool result: {text}"})
    if texts or calls:
        chat: dict[str, Any] = {"role": role, "content": texts[0]["text"] if len(texts) == 1 else texts or None}
        if calls:
            chat["tool_calls"] = calls
        out.append(chat)
    return out


def anthropic_to_chat(body: Mapping[str, Any], *, counting: bool = False) -> dict[str, Any]:
    """The chat request SGLang would serve for an Anthropic Messages request (``counting``: a
    ``count_tokens`` request, which has no ``max_tokens``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages: expected a non-empty list")
    chat_messages: list[dict[str, Any]] = []
    system = _text_of(body.get("system"), "system")
    if system:
        chat_messages.append({"role": "system", "content": system})
    for i, message in enumerate(messages):
        chat_messages += _anthropic_message(message, f"messages[{i}]")
    if not chat_messages:
        raise PromptError("messages: no message has content")
    chat: dict[str, Any] = {"messages": chat_messages, "stream": body.get("stream", False)}
    if not counting:
        chat["max_tokens"] = _cap(body, "max_tokens", required=True)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, Mapping) and isinstance(t.get("name"), str) for t in tools):
            raise PromptError("tools: expected a list of tools, each with a name")
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description") or "",
                    "parameters": t.get("input_schema") or {},
                },
            }
            for t in tools
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in _TOOL_CHOICE:
            chat["tool_choice"] = _TOOL_CHOICE[kind]
        else:
            raise PromptError(f"tool_choice.type: expected auto, any, tool or none, got {kind!r}")
    return {k: v for k, v in chat.items() if v is not None}


def _responses_item(item: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(item, Mapping):
        raise PromptError(f"{where}: expected an input item object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise PromptError(f"{where}.role: expected user, assistant, system or developer")
        return {"role": role, "content": _text_of(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        call = {"id": item.get("call_id") or "", "type": "function"}
        call["function"] = {"name": item.get("name") or "", "arguments": item.get("arguments") or "{}"}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "tool", "tool_call_id": item.get("call_id") or "", "content": _text_of(output, f"{where}.output")}
    return None  # reasoning and other items carry no prompt text the double reads


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat request for a Responses API request."""
    items = body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        messages += [m for i, item in enumerate(items) if (m := _responses_item(item, f"input[{i}]")) is not None]
    else:
        raise PromptError("input: expected a string or a list of input items")
    chat: dict[str, Any] = {"messages": messages, "stream": body.get("stream", False)}
    cap = _cap(body, "max_output_tokens", required=False)
    if cap is not None:
        chat["max_tokens"] = cap
    tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping) and t.get("type") == "function"]
    if tools:
        chat["tools"] = [
            {"type": "function", "function": {"name": t.get("name"), "parameters": t.get("parameters") or {}}} for t in tools
        ]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, str):
        chat["tool_choice"] = choice
    return chat
