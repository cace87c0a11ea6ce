"""Claude Code hooks as maitred events (SPEC section 8).

Two ways in, one mapping:

- ``type: http`` hooks post the raw payload to the runtime's ``POST /v1/hooks/claude-code``,
  which calls ``to_events(payload, now)``.
- ``type: command`` hooks run ``maitred hook claude-code`` (or ``python -m
  maitred.integrations.claude_code``): ``run`` reads the payload on stdin, maps it, and sends
  the events to the runtime (``MAITRED_URL``) or, without one, to the store (``MAITRED_DB``).

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
``Stop``                        ``program.wait`` (the human), unless ``background_tasks`` still run
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
- The ``Agent`` tool call stays open on the parent program while the child runs (the parent is
  *acting*: waiting on a child counts as tool time). ``SubagentStart`` carries no
  ``tool_use_id``, so which ``Agent`` call spawned which child is known only by order: the k-th
  ``Agent:<type>`` ``tool.start`` of a session pairs with the k-th child program of that
  ``agent_type``. That is exact for subagents run one at a time and for parallel subagents of
  different types; for parallel subagents of the *same* type the start order need not follow
  the call order, so that pairing (and only it) is ambiguous. For the same reason the handoff
  carries the ``Agent`` call's prompt only when ``SubagentStart`` itself carries one.

Speed: a command hook runs once per tool call, so ``run`` keeps to the standard library on its
hot path (no pydantic, httpx or SQLAlchemy: ``wire_events`` builds the wire form directly) and
posts to the runtime with ``http.client``. Without a runtime, the store write (SQLAlchemy, the
migration check) is handed to a detached writer process so the hook itself exits at once.
It never fails the hook: exit status 0 always, one line on stderr for anything it dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maitred.events import Event

__all__ = [
    "HOOK_EVENTS",
    "HookPayloadError",
    "add_arguments",
    "child_program_id",
    "command_word",
    "handle_payload",
    "main",
    "run",
    "to_events",
    "wire_events",
]

FRAMEWORK = "claude-code"
#: The agent of a session's main thread (Claude Code names only subagents).
MAIN_AGENT = "main"
#: Claude Code 2.1 calls the subagent tool ``Agent``; earlier versions called it ``Task``.
AGENT_TOOLS = frozenset({"Agent", "Task"})
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


def child_program_id(session_id: str, agent_id: str) -> str:
    """The program id of a subagent: stable across hooks, so no state is needed to pair them."""
    return f"{session_id}/agent-{agent_id}"


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
        return []  # paused on its own background work, not waiting for the human
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


# -- the command hook -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``maitred hook claude-code`` (the payload itself comes on stdin)."""
    parser.add_argument("--runtime-url", default=None, help="maitred runtime to send to (default: $MAITRED_URL)")
    parser.add_argument(
        "--db",
        default=None,
        help="store to write to without a runtime, or when it is down "
        "(default: $MAITRED_DB; without a runtime, sqlite:///maitred.db)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the runtime or the store (default 3)")
    parser.add_argument(
        "--foreground", action="store_true", help="write to the store before exiting instead of in a detached background process"
    )
    # How the hook hands a store write to its detached writer (internal).
    parser.add_argument("--payload-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--received-at", type=float, default=None, help=argparse.SUPPRESS)


def _log(message: str) -> None:
    sys.stderr.write(f"{_PROG}: {message}\n")


def run(args: argparse.Namespace) -> int:
    """Read one payload on stdin and deliver its events. Always 0: a hook must never fail."""
    try:
        if args.payload_file:  # the detached writer: the payload the hook left, stamped when it arrived
            os.nice(10)  # a background write: the agent and its tools go first
            with open(args.payload_file, "rb") as handed:
                raw = handed.read()
            os.unlink(args.payload_file)
            _deliver(args, raw, args.received_at or time.time())
        else:
            _deliver(args, sys.stdin.buffer.read(), time.time())
    except Exception as exc:  # the last guard: whatever happens, Claude Code goes on
        _log(f"hook ignored: {type(exc).__name__}: {exc}")
    return 0


def _deliver(args: argparse.Namespace, raw: bytes, now: float) -> None:
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        _log(f"hook ignored: the payload on stdin is not JSON ({exc})")
        return
    try:
        events = wire_events(payload, now)
    except HookPayloadError as exc:
        _log(
            f"hook ignored: malformed {payload.get('hook_event_name', 'hook') if isinstance(payload, dict) else 'hook'} payload: {exc}"
        )
        return
    if not events:
        return
    url = args.runtime_url or os.environ.get("MAITRED_URL")
    db = args.db or os.environ.get("MAITRED_DB")
    if url:
        error = _post(url, events, os.environ.get("MAITRED_TOKEN"), args.timeout)
        if error is None:
            return
        if not db:
            _log(f"{len(events)} events dropped: the runtime at {url} {error} (set MAITRED_DB to keep them in the store)")
            return
    if args.foreground or args.payload_file:
        _write_store(payload, now, db, args.timeout)
    else:
        _detached(raw, now, db, args.timeout)


def _post(url: str, events: list[Wire], token: str | None, timeout: float) -> str | None:
    """POST the events to ``<url>/v1/events``; None on success, else what went wrong.

    ``http.client`` rather than the middleware's ``HttpSink`` (httpx): this runs in a process
    that lives for one payload, where importing httpx alone costs more than the whole hook."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"URL {url!r} is not http(s)://HOST[:PORT]"
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    headers = {"content-type": "application/json", "user-agent": "maitred-hook-claude-code"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    conn = conn_cls(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", f"{parts.path}/v1/events", body=json.dumps(events, separators=(",", ":")), headers=headers)
        response = conn.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"is unreachable ({type(exc).__name__}: {exc})"
    finally:
        conn.close()
    if response.status >= 500:
        return f"answered {response.status}"
    if response.status >= 400:
        _log(f"the runtime refused {len(events)} events: {response.status} {body[:300].decode(errors='replace')}")
        return None  # retrying a refused batch elsewhere cannot help
    try:
        rejected = json.loads(body).get("rejected") or []
    except (ValueError, AttributeError):
        rejected = []
    if rejected:
        _log(f"the runtime refused {len(rejected)} of {len(events)} events, first: {rejected[0]}")
    return None


def _write_store(payload: Mapping[str, Any], now: float, db: str | None, timeout: float) -> None:
    """Through the middleware's emitter to the store (validation, retries, drop accounting)."""
    import maitred
    from maitred.middleware.config import default_db_url

    maitred.configure(db_url=db or default_db_url())
    handle_payload(payload, now)
    maitred.shutdown(timeout=timeout)


def _detached(raw: bytes, now: float, db: str | None, timeout: float) -> None:
    """Hand the store write to a detached writer process and return at once, so Claude Code sees
    the hook end while the write (SQLAlchemy, the migration check) goes on.

    The writer is a fresh ``--foreground`` run in a new session, its standard streams on
    /dev/null (or ``$MAITRED_HOOK_LOG``), the payload in a temporary file. It is spawned rather
    than forked: a forked child holds Claude Code's output pipes until it is first scheduled,
    which on a busy machine kept the hook "running" ~0.1 s longer; ``subprocess`` spawns with
    vfork, where the parent waits only for the exec."""
    import subprocess
    import tempfile

    fd, path = tempfile.mkstemp(prefix="maitred-hook-", suffix=".json")
    with os.fdopen(fd, "wb") as handed:
        handed.write(raw)
    argv = [
        sys.executable,
        "-m",
        "maitred.integrations.claude_code",
        "--payload-file",
        path,
        "--received-at",
        repr(now),
        "--timeout",
        str(timeout),
    ]
    if db:
        argv += ["--db", db]
    env = {k: v for k, v in os.environ.items() if k != "MAITRED_URL"}  # the writer goes to the store only
    log_path = os.environ.get("MAITRED_HOOK_LOG")
    log = open(log_path, "ab") if log_path else None  # handed to the child, closed below
    try:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log if log is not None else subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        os.unlink(path)
        _log(f"events not stored: the background writer did not start ({exc})")
    finally:
        if log is not None:
            log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=_PROG, description="Record one Claude Code hook payload (read on stdin) in maitred.")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
