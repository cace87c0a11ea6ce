"""Which program a model request belongs to (SPEC 7.5), and what the worker must not see of it.

In order: body ``program_id``, ``extra_body.program_id``, ``metadata.program_id``, then the
headers ``X-Program-Id``, ``x-litellm-session-id``, ``X-Claude-Code-Session-Id``. Every
body location is stripped before forwarding (workers reject or ignore unknown fields; SGLang's
OpenAI protocol forbids some), emptied containers with it. Behind a LiteLLM proxy the id only
arrives as the top-level body ``program_id`` (LiteLLM forwards neither client headers nor body
``metadata``), which is where maitred's LiteLLM callback puts it. Last, a Claude Code request
that names no program otherwise (versions before the session header) is its session, read from
``metadata.user_id`` (``claude_code_session``); ``user_id`` itself is forwarded untouched.
"""

import json
import re
from collections.abc import Mapping
from typing import Any

from maitred.events import MAX_ID_LENGTH, PROGRAM_ID_HEADERS
from maitred.gateway.guard import HTTPProblem


def _valid(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise HTTPProblem(
            400, f"{where}: expected a string of 1 to {MAX_ID_LENGTH} characters, got {str(value)[:64]!r}", field=where
        )
    return value


def _pop_nested(body: dict[str, Any], container: str) -> Any:
    inner = body.get(container)
    if not isinstance(inner, dict) or "program_id" not in inner:
        return None
    value = inner.pop("program_id")
    if not inner:
        del body[container]
    return value


#: Claude Code's ``metadata.user_id`` before 2.1.78: ``user_<hash>_account_<uuid or empty>_session_<uuid>``.
_LEGACY_USER_ID = re.compile(r"_session_([0-9A-Za-z-]+)$")


def claude_code_session(body: Mapping[str, Any]) -> str | None:
    """The session id in a Claude Code request's ``metadata.user_id``, or None. Since 2.1.78 it
    is a JSON object in a string (``{"device_id", "account_uuid", "session_id"}``), before that
    the legacy pattern above; only the session part is taken (device and account are the same
    for every session of a user)."""
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if not isinstance(user_id, str):
        return None
    if user_id.startswith("{"):
        try:
            decoded = json.loads(user_id)
        except ValueError:
            return None
        session = decoded.get("session_id") if isinstance(decoded, dict) else None
        return session if isinstance(session, str) and 0 < len(session) <= MAX_ID_LENGTH else None
    match = _LEGACY_USER_ID.search(user_id)
    return match.group(1) if match and len(match.group(1)) <= MAX_ID_LENGTH else None


def take_program_id(body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str | None, bool]:
    """The program id (None: a one-step program) and whether ``body`` was changed. Every body
    location is stripped, also those after the one that wins."""
    found: str | None = None
    changed = False
    if "program_id" in body:
        found = _valid(body.pop("program_id"), "program_id")
        changed = True
    for container in ("extra_body", "metadata"):
        value = _pop_nested(body, container)
        if value is not None:
            changed = True
            checked = _valid(value, f"{container}.program_id")
            found = found or checked
    if found is None:
        for name in PROGRAM_ID_HEADERS:
            value = headers.get(name)
            if value is not None:
                found = _valid(value, name)
                break
    return found or claude_code_session(body), changed
