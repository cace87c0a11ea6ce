"""What the simulated worker answers: filler words, or with ``--script-tools`` a scripted tool loop.

Replies are decided before the request enters the engine (the engine model needs the output
length up front), and are deterministic functions of the prompt, so a test can predict them.

Scripted tools: a chat request that offers ``tools`` gets one tool call per step, for
``script_steps`` steps counted since the last user message, then a final message. The call
goes to the tools in turn (or to the one ``tool_choice`` names) with arguments built from the
tool's JSON schema: every required property (all of them when none is marked required) gets a
value of its type — a string naming the property and the step, the step number for numbers,
``true``, ``[]``, ``{}``, or an enum's first value. ``tool_choice: "none"`` skips straight
to the final message.
"""

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maitred.sim.worker.session_script import SessionScript, reply_parts
from maitred.sim.worker.tokens import IM_END, Prompt, PromptError, message_body, seq_seed, tokenize, words

DEFAULT_CHAT_TOKENS = 16


@dataclass(frozen=True, slots=True)
class Reply:
    output_ids: list[int]
    words: list[str]  # generated words, in order (empty for a tool call)
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str  # "stop", "length" or "tool_calls"

    @property
    def text(self) -> str:
        return " ".join(self.words)


def text_reply(prompt: Prompt, max_tokens: int) -> Reply:
    """``max_tokens`` filler words (the double never stops early: finish reason ``length``)."""
    return Reply(tokenize(" ".join(w := words(seq_seed(prompt.ids), max_tokens))), w, None, "length")


def chat_reply(
    body: Mapping[str, Any],
    prompt: Prompt,
    max_tokens: int | None,
    *,
    script_tools: bool,
    script_steps: int,
    script: SessionScript | None = None,
) -> Reply:
    if script is not None:
        found = script.answer(body.get("messages") or [])
        if found is not None:
            return Reply(*reply_parts(*found))
    tools = body.get("tools")
    if script_tools and tools:
        return _scripted(body, tools, prompt, script_steps)
    if max_tokens is not None:
        return text_reply(prompt, max_tokens)
    w = words(seq_seed(prompt.ids), DEFAULT_CHAT_TOKENS - 1)
    return Reply(tokenize(" ".join(w)) + [IM_END], w, None, "stop")


def _steps_since_user(messages: list[Any]) -> int:
    """Tool-calling steps since the last user turn. A user message right after tool results is
    not a new turn: an Anthropic user message that carries tool results and text (Claude Code
    adds reminders) becomes tool messages followed by that text as a user message."""
    steps = 0
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i].get("role")
        if role == "user" and (i == 0 or messages[i - 1].get("role") != "tool"):
            break
        if role == "assistant" and messages[i].get("tool_calls"):
            steps += 1
    return steps


def _tool_function(tool: Any, where: str) -> Mapping[str, Any]:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise PromptError(f"{where}.function.name: expected a string")
    return function


def _pick(tools: list[Any], choice: Any, step: int) -> Mapping[str, Any]:
    functions = [_tool_function(t, f"tools[{i}]") for i, t in enumerate(tools)]
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        for f in functions:
            if f["name"] == name:
                return f
        raise PromptError(f"tool_choice.function.name: {name!r} is not among the tools")
    return functions[step % len(functions)]


def _value(name: str, schema: Any, step: int) -> Any:
    if not isinstance(schema, Mapping):
        return f"{name}-{step}"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    samples: dict[Any, Any] = {"integer": step + 1, "number": step + 1, "boolean": True, "array": [], "object": {}}
    return samples.get(kind, f"{name}-{step}")


def arguments_for(function: Mapping[str, Any], step: int) -> dict[str, Any]:
    params = function.get("parameters")
    if not isinstance(params, Mapping):
        return {}
    props = params.get("properties")
    if not isinstance(props, Mapping):
        return {}
    required = params.get("required")
    names = [n for n in required if n in props] if isinstance(required, list) and required else list(props)
    return {n: _value(n, props[n], step) for n in names}


def _scripted(body: Mapping[str, Any], tools: Any, prompt: Prompt, script_steps: int) -> Reply:
    if not isinstance(tools, list):
        raise PromptError("tools: expected a list")
    step = _steps_since_user(body["messages"])
    choice = body.get("tool_choice")
    if step >= script_steps or choice == "none":
        w = f"Finished after {step} tool calls .".split()
        return Reply(tokenize(" ".join(w)) + [IM_END], w, None, "stop")
    function = _pick(tools, choice, step)
    call_id = f"call_{zlib.crc32(repr(prompt.ids[-32:]).encode()):08x}_{step}"
    calls = [
        {
            "id": call_id,
            "index": 0,
            "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments_for(function, step))},
        }
    ]
    ids = message_body({"content": None, "tool_calls": calls}, "reply") + [IM_END]
    return Reply(ids, [], calls, "tool_calls")
