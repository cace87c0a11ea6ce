"""``maitred sim-worker --script FILE``: answer whole agent sessions from a script.

Why: a real agent CLI (Claude Code, Codex) decides what to run from the model's answers, so an
end-to-end test of it needs answers it can predict: *this* command, then *that* subagent, then
a final text. ``--script-tools`` calls the offered tools in turn with filler arguments, which
is enough for a framework's tool loop but not for an agent with twenty tools. A script names
the calls.

The file is a JSON object from script names to turns. A conversation picks its script by a
``SCRIPT:<name>`` marker in its first user message (the session's prompt names one; a
subagent's task prompt names its own), and its answer is the turn at the number of assistant
messages it already holds, so retries and parallel conversations answer alike. A turn is a
final text (a string) or a list of tool calls answered together, each ``{"name": ...,
"input": {...}}``. Past the last turn a conversation gets the text ``done``; a conversation
that names no script (an agent's own side calls) is answered as without ``--script``::

    {"main": [[{"name": "Bash", "input": {"command": "sleep 1"}}], "all done"]}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maitred.sim.worker.tokens import IM_END, message_body, tokenize

_MARKER = re.compile(r"SCRIPT:([A-Za-z0-9_-]+)")
#: The text past a script's last turn.
AFTER_THE_END = "done"


class ScriptError(ValueError):
    """A script file maitred cannot use; the message names the file and the field."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: Mapping[str, Any]


Turn = str | tuple[ToolCall, ...]


@dataclass(frozen=True)
class SessionScript:
    turns: Mapping[str, tuple[Turn, ...]]

    def answer(self, messages: Sequence[Any]) -> tuple[str, int, Turn] | None:
        """(script name, turn index, the turn) for a chat conversation; None when it names no
        script of this file."""
        name = _script_of(messages)
        if name is None or name not in self.turns:
            return None
        done = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
        turns = self.turns[name]
        return name, done, turns[done] if done < len(turns) else AFTER_THE_END


def load_script(path: str | Path) -> SessionScript:
    """Read and check a script file (``ScriptError`` naming the file and field)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"--script {path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ScriptError(f"--script {path}: not JSON ({exc})") from None
    return parse_script(data, where=f"--script {path}")


def parse_script(data: Any, *, where: str = "script") -> SessionScript:
    if not isinstance(data, Mapping) or not data:
        raise ScriptError(f"{where}: expected a JSON object of script names to turns")
    turns: dict[str, tuple[Turn, ...]] = {}
    for name, entries in data.items():
        if not _MARKER.fullmatch(f"SCRIPT:{name}"):
            raise ScriptError(f"{where}: script name {name!r}: use letters, digits, _ and - only")
        if not isinstance(entries, list):
            raise ScriptError(f"{where}: {name}: expected a list of turns")
        turns[name] = tuple(_turn(entry, f"{where}: {name}[{i}]") for i, entry in enumerate(entries))
    return SessionScript(turns)


def _turn(entry: Any, where: str) -> Turn:
    if isinstance(entry, str):
        return entry
    if not isinstance(entry, list) or not entry:
        raise ScriptError(f"{where}: expected a final text or a non-empty list of tool calls")
    calls = []
    for j, call in enumerate(entry):
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str) or not call["name"]:
            raise ScriptError(f"{where}[{j}].name: expected the tool's name")
        arguments = call.get("input", {})
        if not isinstance(arguments, Mapping):
            raise ScriptError(f"{where}[{j}].input: expected a JSON object")
        calls.append(ToolCall(call["name"], dict(arguments)))
    return tuple(calls)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def _script_of(messages: Sequence[Any]) -> str | None:
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "user":
            found = _MARKER.search(_text_of(message.get("content")))
            return found.group(1) if found else None
    return None


def reply_parts(name: str, index: int, turn: Turn) -> tuple[list[int], list[str], list[dict[str, Any]] | None, str]:
    """(output ids, words, tool calls in chat form, finish reason) of one scripted turn."""
    if isinstance(turn, str):
        words = turn.split()
        return tokenize(turn) + [IM_END], words, None, "stop"
    calls = [
        {
            "id": f"call_{name}_{index}_{i}",
            "index": i,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(dict(call.input))},
        }
        for i, call in enumerate(turn)
    ]
    return message_body({"content": None, "tool_calls": calls}, "reply") + [IM_END], [], calls, "tool_calls"
