"""Where clients already name their session on the wire, in the order maitred reads them.

A program id (SPEC 2) is the client's own session id. Many clients send one without being asked,
so the gateway reads theirs rather than asking every user to add ``X-Program-Id``. This module is
the one list of those places; it is pure (no web framework, no maitred import), so the gateway,
the integrations and ``maitred.events`` all read the same list. Validation (length, type) is the
caller's: the gateway answers 400 naming ``IdSource.field``.

Order: maitred's own fields first (the body ones are stripped before forwarding: workers reject
or ignore unknown fields), then ids a user sets on purpose (LiteLLM's), then the ids coding
agents send by themselves (Claude Code, Codex), then other routers' affinity keys (SGLang's
gateway, NVIDIA Dynamo), which a client sets only to pin a session. Other clients' fields stay in
the forwarded body: they belong to the client and its upstream, not to maitred.

In order (``ID_SOURCES``), each checked against the client's own source or docs:

- maitred: body ``program_id``, ``extra_body.program_id``, ``metadata.program_id``, header
  ``x-program-id`` (SPEC 7.5).
- LiteLLM: header ``x-litellm-session-id``, body ``metadata.session_id`` (litellm 1.110
  ``litellm/proxy/litellm_pre_call_utils.py``: ``get_chain_id_from_headers``,
  ``_caller_body_session_id``; docs.litellm.ai/docs/proxy/ui_logs_sessions).
- Claude Code: header ``x-claude-code-session-id`` (v2.1.86 and later;
  code.claude.com/docs/en/llm-gateway-protocol), body ``metadata.user_id`` (``claude_code_session``;
  both forms as coder/aibridge PR 241 and litellm's ``_get_anthropic_session_id_from_metadata`` read them).
- OpenAI Codex CLI: header ``session-id``, and ``session_id`` from builds before the codex-api
  split (openai/codex ``codex-rs/codex-api/src/requests/headers.rs``: ``build_session_headers``,
  formerly ``build_conversation_headers``).
- SGLang model gateway: header ``x-smg-routing-key``, what its ``consistent_hashing`` and
  ``manual`` policies hash on (sgl-project/sglang ``sgl-model-gateway/src/policies/consistent_hashing.rs``).
- NVIDIA Dynamo: header ``x-dynamo-session-id`` (ai-dynamo/dynamo ``docs/agents/session-ids.md``).

Not on the wire: the OpenAI Agents SDK's ``group_id`` lives on the trace only (the
``MaitredTracingProcessor`` reads it); a LangGraph ``thread_id`` lives in the run config (the
LangGraph adapters read it, then send ``program_id`` and ``x-program-id`` on each model request).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

__all__ = [
    "CLAUDE_CODE_AGENT_HEADER",
    "ID_SOURCES",
    "PROGRAM_HEADER",
    "IdSource",
    "claude_code_child",
    "claude_code_root",
    "claude_code_session",
    "client_program_id",
    "header_names",
    "program_header",
]

#: maitred's own header, the one its integrations send (with the body's ``program_id``).
PROGRAM_HEADER = "x-program-id"
#: Claude Code (2.1.3xx) names the subagent a model request comes from in this header, beside
#: its session's ``x-claude-code-session-id``; the value is the hooks' ``agent_id``.
CLAUDE_CODE_AGENT_HEADER = "x-claude-code-agent-id"


def claude_code_child(session_id: str, agent_id: str) -> str:
    """The program id of a Claude Code subagent: the hooks (``agent_id`` on every hook fired in
    it) and the model requests (``CLAUDE_CODE_AGENT_HEADER``) both name it, so no state pairs them."""
    return f"{session_id}/agent-{agent_id}"


def program_header(program_id: str) -> dict[str, str]:
    """``{PROGRAM_HEADER: program_id}`` for a request that carries the program's events, or
    nothing where the id cannot be a header value (not printable ASCII: event ids may be any
    text, HTTP header values may not); such a program's events still go, unhashed."""
    ok = program_id.isascii() and program_id.isprintable()
    return {PROGRAM_HEADER: program_id} if ok else {}


def claude_code_root(program_id: str) -> str:
    """The session a Claude Code program id belongs to (the id itself for a session): its model
    requests carry only the session's ``x-claude-code-session-id``, so a balancer hashing on the
    session keeps a subagent's hook events with them only when they are sent under the session."""
    return program_id.split("/agent-", 1)[0]


def claude_code_session(user_id: Any) -> str | None:
    """The session part of Claude Code's ``metadata.user_id``, else None (not Claude Code's).

    Two forms: the legacy ``user_<hex>_account_<uuid>_session_<uuid>`` string, and (since
    2.1.x) a JSON-encoded string ``{"device_id": ..., "account_uuid": ..., "session_id": ...}``.
    Anything else, e.g. the end-user id other Anthropic API clients put there, is not a session
    id, so it is ignored rather than refused."""
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            decoded = json.loads(user_id)
        except ValueError:
            return None
        session = decoded.get("session_id") if isinstance(decoded, dict) else None
        return session if isinstance(session, str) and session else None
    found = _LEGACY_USER_ID.fullmatch(user_id)
    return found.group(1) if found else None


_LEGACY_USER_ID = re.compile(r"user_[0-9a-fA-F]*_account_[0-9a-fA-F-]*_session_([0-9a-fA-F-]+)")


class IdSource(NamedTuple):
    """One place a program id may arrive.

    ``path`` is the header name (lower case, as ASGI delivers it) or the keys down the JSON
    body; ``parse`` turns a client's field into its session id (None: not one, skip it);
    ``strip`` marks maitred's own body fields, removed before the request is forwarded.

    A ``NamedTuple`` rather than a dataclass: the Claude Code command hook imports this module
    on every hook event, and importing ``dataclasses`` (with ``inspect``) costs it ~5 ms."""

    client: str
    where: Literal["header", "body"]
    path: tuple[str, ...]
    parse: Callable[[Any], str | None] | None = None
    strip: bool = False

    @property
    def field(self) -> str:
        """How errors name it: ``metadata.user_id``, ``x-program-id``."""
        return ".".join(self.path)

    def read(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
        """The raw value here (parsed where the client's format needs it), None when absent."""
        if self.where == "header":
            value: Any = headers.get(self.path[0])
        else:
            value = body
            for key in self.path:
                value = value.get(key) if isinstance(value, Mapping) else None
        if value is None or self.parse is None:
            return value
        return self.parse(value)


#: Every place, in the order read; the first present wins.
ID_SOURCES: tuple[IdSource, ...] = (
    IdSource("maitred", "body", ("program_id",), strip=True),
    IdSource("maitred", "body", ("extra_body", "program_id"), strip=True),
    IdSource("maitred", "body", ("metadata", "program_id"), strip=True),
    IdSource("maitred", "header", (PROGRAM_HEADER,)),
    IdSource("litellm", "header", ("x-litellm-session-id",)),
    IdSource("litellm", "body", ("metadata", "session_id")),
    IdSource("claude-code", "header", ("x-claude-code-session-id",)),
    IdSource("claude-code", "body", ("metadata", "user_id"), parse=claude_code_session),
    IdSource("codex", "header", ("session-id",)),
    IdSource("codex", "header", ("session_id",)),
    IdSource("sglang-gateway", "header", ("x-smg-routing-key",)),
    IdSource("dynamo", "header", ("x-dynamo-session-id",)),
)


def client_program_id(body: Mapping[str, Any], headers: Mapping[str, str]) -> tuple[Any, IdSource] | None:
    """The first id a client sent (maitred's own body fields aside: the caller reads and strips
    those first) and where it was found; the value is unchecked, the caller validates it. A
    Claude Code request that also names its subagent (``CLAUDE_CODE_AGENT_HEADER``) is the
    subagent's: its session's child program."""
    for source in ID_SOURCES:
        if source.strip:
            continue
        value = source.read(body, headers)
        if value is None:
            continue
        agent = headers.get(CLAUDE_CODE_AGENT_HEADER) if source.client == "claude-code" else None
        if isinstance(value, str) and isinstance(agent, str) and agent:
            value = claude_code_child(value, agent)
        return value, source
    return None


def header_names() -> tuple[str, ...]:
    """The headers of ``ID_SOURCES``, in order (lower case)."""
    return tuple(s.path[0] for s in ID_SOURCES if s.where == "header")
