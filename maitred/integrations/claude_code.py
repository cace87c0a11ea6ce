"""Claude Code hooks as maitred events (SPEC section 8).

Two ways in, one mapping:

- ``type: http`` hooks post the raw payload to the runtime's ``POST /v1/hooks/claude-code``,
  which calls ``to_events(payload, now)``.
- ``type: command`` hooks run ``maitred hook claude-code`` (or ``python -m
  maitred.integrations.claude_code``): ``maitred.integrations.claude_code_hook`` maps the
  payload on stdin with ``wire_events`` and spools the events for a deliverer that sends them,
  in order, to the runtime (``MAITRED_URL``) or the store (``MAITRED_DB``).

Mapping (one payload gives zero, one or two events; ``now`` stamps them all):

==============================  ===============================================================
``SessionStart``                ``program.start`` (``source: compact`` continues a session: none)
``SessionEnd``                  ``program.end``
``PreToolUse``                  ``tool.start``: ``tool_use_id`` is the call id; Bash ``timeout``
                                (ms) and Monitor ``timeout_ms`` are the deadline (Monitor with
                                ``persistent: true`` has none); ``run_in_background`` marks it
                                background; the signature is ``Bash:<first word>``,
                                ``Monitor:<first word>`` or ``Agent:<subagent_type>``
``PostToolUse``                 ``tool.end`` ok, ``duration_ms`` as the duration
``PostToolUseFailure``          ``tool.end`` error (``interrupted`` for ``is_interrupt``,
                                ``timeout`` when the error says the command timed out)
``SubagentStart``               ``program.start`` of the child program (parent: the session) and
                                a ``handoff`` main -> ``agent_type`` naming the child
``SubagentStop``                ``program.end`` of the child and the hand-back ``handoff``
                                ``agent_type`` -> main with its last message as shared context
``Stop``                        ``program.wait``: reason ``human``, or ``background`` while
                                ``background_tasks`` still run (the session resumes by itself)
``StopFailure``                 ``program.wait`` (a turn that ended on an API error waits too)
``UserPromptSubmit``            ``program.resume`` (``source: user``, and wake-ups alike: any
                                prompt ends the wait)
==============================  ===============================================================

State across hook invocations: none is kept. Each command hook is a separate process, so every
payload maps on its own and the pairing lives in the events themselves:

- A subagent's child program id is ``<session_id>/agent-<agent_id>``. Claude Code puts
  ``agent_id`` on *every* hook fired inside a subagent, so its tool calls land on the child
  program exactly, parallel subagents included.
- ``Stop`` -> ``UserPromptSubmit`` is a ``program.wait`` then a ``program.resume``; the store
  and the runtime pair them by time (a resume with no open wait is a no-op there).
- Subagents run in the foreground or the background. In the foreground (``run_in_background:
  false``) the ``Agent`` call stays open on the parent while the child runs: the parent is
  *acting*, as waiting on a child counts as tool time, and its ``PostToolUse`` comes after the
  child's ``SubagentStop``. In the background (Claude Code 2.1's default) the ``Agent`` call
  ends within milliseconds (``tool_response``: ``{"isAsync": true, "status":
  "async_launched", "agentId": ...}``), the parent goes on, and its ``Stop`` lists the child
  under ``background_tasks`` (a ``background`` wait); the child's end comes back as a
  ``UserPromptSubmit`` whose prompt is a ``<task-notification>``, which resumes the parent.
  Either way ``tool_response.agentId`` names the child of each ``Agent`` call.
- Model requests of a subagent carry the *parent's* session id (``x-claude-code-session-id``
  and ``metadata.user_id``). Claude Code 2.1.3xx also sends ``x-claude-code-agent-id`` (the
  hooks' ``agent_id``), so the gateway puts them on the child exactly
  (``maitred.identity.client_program_id``). Without that header (older versions, or a proxy
  that drops it) the runtime gives such a request to the child only when that is unambiguous:
  exactly one child runs and the parent is blocked on a tool call or waiting
  (``RuntimeState.speaker``); with parallel subagents, or a background child while the parent
  itself works, nothing tells them apart and the request stays on the parent.
- Timestamps: payloads carry none, so an event is stamped when its hook process starts, and
  async hook processes race: a fast call's end can be stamped before its start. The end's
  ``duration_ms`` is exact, and the store places the start by it (an end never precedes its
  start there).

Speed: a command hook runs once per tool call, so the hook keeps to the standard library
(no pydantic, httpx or SQLAlchemy: ``wire_events`` builds the wire form directly); what it
costs and why it spools is in ``maitred.integrations.claude_code_hook``.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from maitred.identity import claude_code_child as child_program_id

if TYPE_CHECKING:
    from maitred.events import Event

__all__ = [
    "HOOK_EVENTS",
    "HookPayloadError",
    "child_program_id",
    "command_word",
    "handle_payload",
    "to_events",
    "wire_events",
]

FRAMEWORK = "claude-code"
#: The agent of a session's main thread (Claude Code names only subagents).
MAIN_AGENT = "main"
#: Claude Code 2.1 calls the subagent tool ``Agent``; earlier versions called it ``Task``.
AGENT_TOOLS = frozenset({"Agent", "Task"})
#: ``program.wait`` reason of a session that stopped on its own background work
#: (``maitred.events.BACKGROUND_WAIT``, spelled out so the hook imports nothing heavy).
BACKGROUND = "background"
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_MAX_WORD = 128
_PROG = "maitred hook claude-code"

Wire = dict[str, Any]


class HookPayloadError(ValueError):
    """A hook payload maitred cannot map; ``field`` names the payload field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


# -- reading the payload --------------------------------------------------------------------


def _text(payload: Mapping[str, Any], key: str, *, where: str = "") -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        got = "missing" if value is None else f"a {type(value).__name__}" if not isinstance(value, str) else "empty"
        raise HookPayloadError(where + key, f"must be a non-empty string, got {got}")
    return value


def _optional_text(payload: Mapping[str, Any], key: str, *, where: str = "") -> str | None:
    value = payload.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HookPayloadError(where + key, f"must be a string, got a {type(value).__name__}")
    return value


def _flag(payload: Mapping[str, Any], key: str, *, where: str = "") -> bool:
    value = payload.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise HookPayloadError(where + key, f"must be true or false, got {value!r:.40}")
    return value


def _millis(payload: Mapping[str, Any], key: str, *, where: str = "") -> float | None:
    """A positive number of milliseconds, as seconds; None when absent."""
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise HookPayloadError(where + key, f"must be a non-negative number of milliseconds, got {value!r:.40}")
    return value / 1000.0


def _tool_input(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    value = payload.get("tool_input")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise HookPayloadError("tool_input", f"must be a JSON object, got a {type(value).__name__}")
    return value


def command_word(command: str) -> str | None:
    """The program a shell command runs: its first word, past ``VAR=value`` assignments and a
    leading ``cd DIR &&`` (Claude Code prefixes many commands with one), without its directory."""
    words = command.split()
    if len(words) > 2 and words[0] == "cd" and "&&" in words:
        words = words[words.index("&&") + 1 :]
    for word in words:
        if not _ASSIGNMENT.match(word):
            return word.rsplit("/", 1)[-1][:_MAX_WORD] or None
    return None


def _tool_facts(tool: str, tool_input: Mapping[str, Any]) -> tuple[str | None, float | None, bool]:
    """(signature, deadline in seconds, background) of one tool call."""
    where = "tool_input."
    if tool in ("Bash", "Monitor"):
        command = _optional_text(tool_input, "command", where=where)
        word = command_word(command) if command else None
        signature = f"{tool}:{word}" if word else None
        if tool == "Bash":
            return signature, _millis(tool_input, "timeout", where=where), _flag(tool_input, "run_in_background", where=where)
        persistent = _flag(tool_input, "persistent", where=where)
        return signature, None if persistent else _millis(tool_input, "timeout_ms", where=where), False
    if tool in AGENT_TOOLS:
        kind = _optional_text(tool_input, "subagent_type", where=where)
        return (f"Agent:{kind[:_MAX_WORD]}" if kind else None), None, _flag(tool_input, "run_in_background", where=where)
    return None, None, False


# -- the mapping ----------------------------------------------------------------------------


def _event(kind: str, now: float, program_id: str, agent: str | None, **fields: Any) -> Wire:
    out: Wire = {"v": 1, "type": kind, "ts": now, "program_id": program_id}
    if agent is not None:
        out["agent"] = agent
    out.update((k, v) for k, v in fields.items() if v is not None)
    return out


def _where(payload: Mapping[str, Any], session: str) -> tuple[str, str]:
    """(program id, agent) a hook fired in: the subagent's child program when ``agent_id`` is set."""
    agent_id = _optional_text(payload, "agent_id")
    if agent_id is None:
        return session, MAIN_AGENT
    return child_program_id(session, agent_id), _optional_text(payload, "agent_type") or "subagent"


def _session_start(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    source = _optional_text(p, "source")
    if source == "compact":
        return []
    attrs = {k: p[k] for k in ("source", "model", "agent_type", "cwd") if isinstance(p.get(k), str) and p[k]}
    return [_event("program.start", now, session, MAIN_AGENT, framework=FRAMEWORK, attrs=attrs or None)]


def _session_end(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    return [_event("program.end", now, session, MAIN_AGENT, status="ok")]


def _pre_tool_use(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    tool = _text(p, "tool_name")
    call_id = _text(p, "tool_use_id")
    signature, deadline, background = _tool_facts(tool, _tool_input(p))
    program_id, agent = _where(p, session)
    return [
        _event(
            "tool.start",
            now,
            program_id,
            agent,
            call_id=call_id,
            tool=tool,
            signature=signature,
            deadline_s=deadline or None,
            background=background,
        )
    ]


def _post_tool_use(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    program_id, agent = _where(p, session)
    return [
        _event(
            "tool.end", now, program_id, agent, call_id=_text(p, "tool_use_id"), status="ok", duration_s=_millis(p, "duration_ms")
        )
    ]


def _post_tool_use_failure(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    program_id, agent = _where(p, session)
    error = _optional_text(p, "error") or ""
    if _flag(p, "is_interrupt"):
        status = "interrupted"
    elif "timed out" in error.lower():
        status = "timeout"
    else:
        status = "error"
    return [
        _event(
            "tool.end",
            now,
            program_id,
            agent,
            call_id=_text(p, "tool_use_id"),
            status=status,
            duration_s=_millis(p, "duration_ms"),
        )
    ]


def _subagent_start(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    agent_id = _text(p, "agent_id")
    kind = _optional_text(p, "agent_type") or "subagent"
    child = child_program_id(session, agent_id)
    prompt = _optional_text(p, "prompt")
    return [
        _event(
            "program.start",
            now,
            child,
            kind,
            parent_program_id=session,
            framework=FRAMEWORK,
            attrs={"agent_id": agent_id, "agent_type": kind},
        ),
        _event(
            "handoff",
            now,
            session,
            MAIN_AGENT,
            from_agent=MAIN_AGENT,
            to_agent=kind,
            child_program_id=child,
            messages=[{"role": "user", "content": prompt}] if prompt else None,
        ),
    ]


def _subagent_stop(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    agent_id = _text(p, "agent_id")
    kind = _optional_text(p, "agent_type") or "subagent"
    result = _optional_text(p, "last_assistant_message")
    return [
        _event("program.end", now, child_program_id(session, agent_id), kind, status="ok"),
        _event(
            "handoff",
            now,
            session,
            kind,
            from_agent=kind,
            to_agent=MAIN_AGENT,
            messages=[{"role": "assistant", "content": result}] if result else None,
        ),
    ]


def _stop(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    tasks = p.get("background_tasks")
    if tasks is not None and not isinstance(tasks, list):
        raise HookPayloadError("background_tasks", f"must be a list, got a {type(tasks).__name__}")
    if any(isinstance(t, Mapping) and t.get("status", "running") == "running" for t in tasks or ()):
        # The turn ended on its own background work (a subagent, a background command): the
        # session resumes when that work reports back, not when a person answers.
        return [_event("program.wait", now, session, MAIN_AGENT, reason=BACKGROUND)]
    return [_event("program.wait", now, session, MAIN_AGENT, reason="human")]


def _stop_failure(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    return [_event("program.wait", now, session, MAIN_AGENT, reason="api_error")]


def _user_prompt_submit(p: Mapping[str, Any], session: str, now: float) -> list[Wire]:
    return [_event("program.resume", now, session, MAIN_AGENT)]


_MAPPERS: dict[str, Callable[[Mapping[str, Any], str, float], list[Wire]]] = {
    "SessionStart": _session_start,
    "SessionEnd": _session_end,
    "PreToolUse": _pre_tool_use,
    "PostToolUse": _post_tool_use,
    "PostToolUseFailure": _post_tool_use_failure,
    "SubagentStart": _subagent_start,
    "SubagentStop": _subagent_stop,
    "Stop": _stop,
    "StopFailure": _stop_failure,
    "UserPromptSubmit": _user_prompt_submit,
}
#: Hook events maitred maps; others (Notification, PreCompact, ...) are accepted and ignored.
HOOK_EVENTS = tuple(_MAPPERS)


def wire_events(payload: Mapping[str, Any], now: float) -> list[Wire]:
    """The events of one hook payload in wire form (JSON objects), built with the standard
    library only. Raises ``HookPayloadError`` naming the field when the payload is malformed;
    an event Claude Code sends that maitred does not map gives ``[]``."""
    if not isinstance(payload, Mapping):
        raise HookPayloadError("payload", f"expected a JSON object, got a {type(payload).__name__}")
    name = _text(payload, "hook_event_name")
    session = _text(payload, "session_id")
    mapper = _MAPPERS.get(name)
    return mapper(payload, session, now) if mapper is not None else []


#: Event field -> the payload field it came from, so a refused value is named as the user sent it.
_SOURCE_FIELD = {
    "program_id": "session_id",
    "parent_program_id": "session_id",
    "child_program_id": "agent_id",
    "call_id": "tool_use_id",
    "tool": "tool_name",
    "signature": "tool_input",
    "agent": "agent_type",
    "from_agent": "agent_type",
    "to_agent": "agent_type",
    "deadline_s": "tool_input",
}


def to_events(payload: Mapping[str, Any], now: float) -> list[Event]:
    """The validated events of one hook payload (what the runtime's hook endpoint ingests).

    Raises ``HookPayloadError`` naming the payload field for a malformed payload, including
    values the event vocabulary refuses (an id over 256 characters)."""
    from maitred.events import EventError, decode_event

    events: list[Event] = []
    for wire in wire_events(payload, now):
        try:
            events.append(decode_event(wire, now=now))
        except EventError as exc:
            top = exc.field.split(".", 1)[0]
            source = _SOURCE_FIELD.get(top, top)
            raise HookPayloadError(source, f"{exc.reason} (as {exc.field} of {wire['type']})") from None
    return events


def handle_payload(payload: Mapping[str, Any], now: float | None = None) -> int:
    """Map one hook payload and queue its events on the middleware's emitter (which sends them
    to the runtime or the store as ``maitred.configure`` says). Returns how many were queued."""
    from maitred.middleware.config import emit

    events = to_events(payload, time.time() if now is None else now)
    for event in events:
        emit(event)
    return len(events)


if __name__ == "__main__":
    # Settings written before the hook had its own module run ``python -m
    # maitred.integrations.claude_code``: they keep working. Imported by name at run time, as the
    # hook module imports this one (no import cycle between them).
    import importlib

    sys.exit(importlib.import_module("maitred.integrations.claude_code_hook").main())
