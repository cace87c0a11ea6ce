"""``maitred hook claude-code``: the command hook, and the deliverer behind it.

The hook runs once per Claude Code hook event, as an ``async`` command hook that Claude Code
cancels when a headless turn ends. Its whole job before it may be killed: ignore SIGTERM, stamp
the time, read the payload, map it (``claude_code.wire_events``, standard library only, so a
malformed payload is named on stderr at once), append the events as one line to the spool
(``maitred.integrations.spool``) and, when no deliverer holds that spool, start one. That takes a
few milliseconds past the interpreter's start. The deliverer, a separate process in its own
session, sends the spool in order to the runtime (``MAITRED_URL``, with ``MAITRED_TOKEN``) or the
store (``MAITRED_DB``; with neither, the per-user store ``~/.local/state/maitred/maitred.db``),
and serves every hook of a session with one connection or one open store.

It never fails the hook: exit status 0 always, one line on stderr for anything it could not do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from maitred.identity import claude_code_root, program_header
from maitred.integrations.claude_code import HookPayloadError, wire_events
from maitred.integrations.spool import (
    Destination,
    Spool,
    default_state_dir,
    deliver_forever,
    run_deliverer,
    spool_dir,
)

__all__ = ["add_arguments", "default_store_url", "main", "run"]

_PROG = "maitred hook claude-code"
#: How long a deliverer waits for more hooks after the spool runs dry, so one writer serves a
#: session (``$MAITRED_HOOK_LINGER_S``).
LINGER_S = 20.0
#: How long a deliverer retries a destination that is down before leaving the rest in the spool
#: for the next one.
GIVE_UP_S = 30.0


def _linger_s() -> float:
    try:
        return max(float(os.environ.get("MAITRED_HOOK_LINGER_S", LINGER_S)), 0.0)
    except ValueError:
        return LINGER_S


def default_store_url() -> str:
    """The store the hook writes without ``MAITRED_DB`` or ``MAITRED_URL``: one per user, not a
    ``maitred.db`` in every project folder Claude Code runs in."""
    return f"sqlite:///{default_state_dir() / 'maitred.db'}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``maitred hook claude-code`` (the payload itself comes on stdin)."""
    parser.add_argument("--runtime-url", default=None, help="maitred runtime to send to (default: $MAITRED_URL)")
    parser.add_argument(
        "--db",
        default=None,
        help="store to write to without a runtime, or when it is down (default: $MAITRED_DB; "
        "without a runtime either, the per-user store ~/.local/state/maitred/maitred.db)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the runtime or the store (default 3)")
    parser.add_argument(
        "--foreground", action="store_true", help="deliver everything spooled before exiting instead of in a background process"
    )
    parser.add_argument(
        "--print-settings",
        action="store_true",
        help="print Claude Code settings (hooks for every event) that run this hook with this Python, and exit; "
        "with --runtime-url, http hooks to that gateway (SessionStart stays a command hook: Claude Code refuses http there)",
    )
    # The deliverer the hook starts (internal).
    parser.add_argument("--deliver", action="store_true", help=argparse.SUPPRESS)


#: What ``add_arguments`` parses from an empty command line (a test checks the two agree).
_DEFAULTS: dict[str, Any] = {
    "runtime_url": None,
    "db": None,
    "timeout": 3.0,
    "foreground": False,
    "print_settings": False,
    "deliver": False,
}


def _log(message: str) -> None:
    sys.stderr.write(f"{_PROG}: {message}\n")


def _destination(args: argparse.Namespace) -> Destination:
    url = args.runtime_url or os.environ.get("MAITRED_URL") or None
    db = args.db or os.environ.get("MAITRED_DB") or None
    if url is None and db is None:
        db = default_store_url()
    return Destination(url, db, os.environ.get("MAITRED_TOKEN") or None)


def run(args: argparse.Namespace) -> int:
    """One hook: read the payload on stdin and spool its events. Always 0: a hook must never fail."""
    # First of all: Claude Code's SIGTERM must not cut the hook between reading and spooling.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    at = time.time()
    try:
        if args.print_settings:
            url = args.runtime_url
            if url is not None and not url.startswith(("http://", "https://")):
                _log(f"--runtime-url: expected a gateway's http(s):// base URL, got {url!r}")
                return 2  # a person asked for settings; a hook event is never refused
            sys.stdout.write(settings_json(http=url))
        elif args.deliver:
            os.nice(10)  # background delivery: the agent and its tools go first
            _deliver(_destination(args), args.timeout, foreground=False)
        else:
            _hook(args, sys.stdin.buffer.read(), at)
    except Exception as exc:  # the last guard: whatever happens, Claude Code goes on
        _log(f"hook ignored: {type(exc).__name__}: {exc}")
    return 0


def _hook(args: argparse.Namespace, raw: bytes, at: float) -> None:
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        _log(f"hook ignored: the payload on stdin is not JSON ({exc})")
        return
    try:
        events = wire_events(payload, at)
    except HookPayloadError as exc:
        name = payload.get("hook_event_name", "hook") if isinstance(payload, dict) else "hook"
        _log(f"hook ignored: malformed {name} payload: {exc}")
        return
    if not events:
        return
    destination = _destination(args)
    spool = Spool(spool_dir(destination))
    try:
        spool.append(json.dumps(events, separators=(",", ":")).encode())
    except OSError as exc:
        _log(f"the spool {spool.path} cannot take events ({exc}); delivering them now")
        error = _Sender(destination, args.timeout).send(events)
        if error is not None:
            _log(f"{len(events)} events dropped: {error}")
        return
    if args.foreground:
        _deliver(destination, args.timeout, foreground=True)
    elif not spool.deliverer_running():
        _start_deliverer(destination, args.timeout, spool)


def _start_deliverer(destination: Destination, timeout: float, spool: Spool) -> None:
    """A deliverer in a new session (Claude Code's end does not take it), standard streams on
    /dev/null and the spool's log. Spawned, not forked: a forked child holds Claude Code's
    output pipes until it is first scheduled; ``subprocess`` uses vfork and waits only for the exec."""
    import subprocess

    argv = [sys.executable, "-m", "maitred.integrations.claude_code_hook", "--deliver", "--timeout", str(timeout)]
    if destination.url:
        argv += ["--runtime-url", destination.url]
    if destination.db:
        argv += ["--db", destination.db]
    with open(spool.log_path, "ab") as log:
        try:
            subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, close_fds=True
            )
        except OSError as exc:
            _log(f"events kept in {spool.path}: the deliverer did not start ({exc})")


def _deliver(destination: Destination, timeout: float, *, foreground: bool) -> None:
    """Deliver the spool; in the foreground (``--foreground``) what is there now, trying once."""
    spool = Spool(spool_dir(destination))
    sender = _Sender(destination, timeout)
    linger, give_up = (0.0, 0.0) if foreground else (_linger_s(), GIVE_UP_S)
    try:
        run_deliverer(spool, lambda: deliver_forever(spool, _events_of, sender.send, _log, linger_s=linger, give_up_s=give_up))
    finally:
        sender.close()


def _by_session(events: Sequence[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """Wire events grouped by the Claude Code session they belong to, in order; None for an
    event naming no program (the runtime refuses it alone)."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for event in events:
        program_id = event.get("program_id")
        groups.setdefault(claude_code_root(program_id) if isinstance(program_id, str) else None, []).append(event)
    return groups


def _events_of(line: bytes) -> list[dict[str, Any]]:
    events = json.loads(line)
    if not isinstance(events, list):
        raise ValueError(f"a spool line must hold a JSON array of events, got {type(events).__name__}")
    return events


class _Sender:
    """Sends batches of wire events to the runtime, the store, or the runtime then the store."""

    def __init__(self, destination: Destination, timeout: float) -> None:
        self.destination = destination
        self.timeout = timeout
        self._conn: Any = None
        self._store: Any = None

    def send(self, events: Sequence[dict[str, Any]]) -> str | None:
        """None once delivered (or refused for their content), else what went wrong. To the
        runtime, one request per session (subagents' events with their session's), each with
        the session's ``X-Program-Id``: a balancer hashing on it, or on the
        ``x-claude-code-session-id`` of the session's model requests, sends them to one shard."""
        error = None
        if self.destination.url:
            for session, group in _by_session(events).items():
                error = self._post(session, group)
                if error is not None:
                    break
            if error is None:
                return None
            if not self.destination.db:
                return f"the runtime at {self.destination.url} {error}"
        return self._write(events, after=error)

    def _post(self, session: str | None, events: Sequence[dict[str, Any]]) -> str | None:
        """``http.client`` rather than the middleware's httpx sink: the deliverer imports only
        what it uses, so it starts in milliseconds."""
        import http.client
        from urllib.parse import urlsplit

        url = self.destination.url or ""
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return f"URL {url!r} is not http(s)://HOST[:PORT]"
        headers = {"content-type": "application/json", "user-agent": "maitred-hook-claude-code"}
        if self.destination.token:
            headers["authorization"] = f"Bearer {self.destination.token}"
        if session is not None:
            headers.update(program_header(session))
        body = json.dumps(list(events), separators=(",", ":"))
        for attempt in (1, 2):  # a kept-alive connection the server closed: one fresh try
            if self._conn is None:
                cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
                self._conn = cls(parts.hostname, parts.port, timeout=self.timeout)
            try:
                self._conn.request("POST", f"{parts.path}/v1/events", body=body, headers=headers)
                response = self._conn.getresponse()
                answer = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    return f"is unreachable ({type(exc).__name__}: {exc})"
        if response.status >= 500:
            return f"answered {response.status}"
        if response.status >= 400:
            _log(f"the runtime refused {len(events)} events: {response.status} {answer[:300].decode(errors='replace')}")
            return None  # retrying a refused batch cannot help
        try:
            rejected = json.loads(answer).get("rejected") or []
        except (ValueError, AttributeError):
            rejected = []
        if rejected:
            _log(f"the runtime refused {len(rejected)} of {len(events)} events, first: {rejected[0]}")
        return None

    def _write(self, events: Sequence[dict[str, Any]], *, after: str | None) -> str | None:
        from maitred.events import decode_batch

        batch = decode_batch(events)
        for rejected in batch.rejected:
            _log(f"event refused: {rejected}")
        if not batch.events:
            return None
        try:
            if self._store is None:
                from maitred.storage.store import SessionStore

                if self.destination.db == default_store_url():
                    default_state_dir().mkdir(parents=True, exist_ok=True)
                self._store = SessionStore(self.destination.db or "", connect_timeout_s=self.timeout)
            result = self._store.write(batch.events)
        except Exception as exc:
            if self._store is not None:
                self._store.close()
                self._store = None
            where = f"the runtime {after}, and the store {self.destination.db}" if after else f"the store {self.destination.db}"
            return f"{where} failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        for rejected in result.rejected:
            _log(f"event refused by the store: {rejected}")
        return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._store is not None:
            self._store.close()


#: Claude Code hook events the hook is registered for (``claude_code.HOOK_EVENTS`` maps these).
_TOOL_EVENTS = ("PreToolUse", "PostToolUse", "PostToolUseFailure")


def settings_json(command: str | None = None, *, http: str | None = None) -> str:
    """Claude Code settings registering maitred for every hook event it maps.

    Command hooks by default: ``command`` runs the hook (default: this interpreter's ``-m
    maitred.integrations.claude_code_hook``, so the settings work from a virtual environment
    without ``maitred`` on PATH). With ``http`` (a gateway's base URL), http hooks post to its
    ``/v1/hooks/claude-code`` with ``$MAITRED_TOKEN``, except ``SessionStart``: Claude Code
    refuses http hooks there ("HTTP hooks are not supported for SessionStart"), so that one is a
    command hook sending to the same gateway, or the session would have no start."""
    from maitred.integrations.claude_code import HOOK_EVENTS

    runs = command or f"{shlex.quote(sys.executable)} -m maitred.integrations.claude_code_hook"
    # Claude Code runs the command through a shell and sends SIGTERM to async hooks still
    # running when a headless turn ends, often before the interpreter is up: an ignored SIGTERM
    # survives ``exec``, so the hook is safe from its first instruction, not from its first line.
    if http is not None:
        runs += f" --runtime-url {shlex.quote(http)}"
    command_hook = {"type": "command", "command": f"trap '' TERM; exec {runs}", "async": True, "timeout": 30}
    http_hook = {
        "type": "http",
        "url": f"{(http or '').rstrip('/')}/v1/hooks/claude-code",
        "timeout": 5,
        "headers": {"Authorization": "Bearer $MAITRED_TOKEN"},
        "allowedEnvVars": ["MAITRED_TOKEN"],
    }

    def hook(name: str) -> dict[str, Any]:
        return command_hook if http is None or name == "SessionStart" else http_hook

    hooks = {
        name: [{"matcher": "*", "hooks": [hook(name)]} if name in _TOOL_EVENTS else {"hooks": [hook(name)]}]
        for name in HOOK_EVENTS
    }
    return json.dumps({"hooks": hooks}, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:  # how Claude Code runs it, once per hook event: the defaults, without argparse's cost
        return run(argparse.Namespace(**_DEFAULTS))
    parser = argparse.ArgumentParser(prog=_PROG, description="Record one Claude Code hook payload (read on stdin) in maitred.")
    add_arguments(parser)
    return run(parser.parse_args(args))


if __name__ == "__main__":
    sys.exit(main())
