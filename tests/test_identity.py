"""Program ids as clients put them on the wire: each client's request shape, the order, refusals."""

import copy
import json

import pytest
from starlette.datastructures import Headers

from maitred.events import PROGRAM_ID_HEADERS
from maitred.gateway.guard import HTTPProblem
from maitred.gateway.programid import take_program_id
from maitred.identity import CLAUDE_CODE_AGENT_HEADER, ID_SOURCES, claude_code_session
from maitred.integrations.claude_code import child_program_id

SESSION = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"


def wire(**headers: str) -> Headers:
    """Headers as the gateway receives them (Starlette's, case-insensitive), ``_`` kept."""
    return Headers(raw=[(name.replace("__", "-").encode(), value.encode()) for name, value in headers.items()])


def messages_body(**metadata: str) -> dict:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the failing test"}]}],
        "metadata": dict(metadata),
    }


def test_claude_code_session_header_as_claude_code_sends_it():
    headers = wire(
        anthropic__version="2023-06-01",
        anthropic__beta="claude-code-20250219,interleaved-thinking-2025-05-14",
        x__claude__code__session__id=SESSION,
        x__app="cli",
    )
    body = messages_body(user_id=json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SESSION}))
    sent = copy.deepcopy(body)
    assert take_program_id(body, headers) == (SESSION, False)
    assert body == sent  # metadata.user_id is Claude Code's: forwarded as it came


def test_claude_code_metadata_user_id_in_both_forms_when_no_header_is_sent():
    legacy = f"user_{'ab12' * 16}_account_7f0e1c2a-93b4-4d5e-8f61-0a1b2c3d4e5f_session_{SESSION}"
    encoded = json.dumps({"device_id": "e3" * 32, "account_uuid": "7f0e1c2a-93b4-4d5e-8f61-0a1b2c3d4e5f", "session_id": SESSION})
    for user_id in (legacy, encoded):
        body = messages_body(user_id=user_id)
        assert take_program_id(body, wire(anthropic__version="2023-06-01")) == (SESSION, False)
        assert body["metadata"] == {"user_id": user_id}


def test_an_end_user_id_of_another_anthropic_client_is_not_a_session():
    for user_id in ("alice@example.com", "user_42", '{"tenant": "acme"}', "{not json"):
        assert claude_code_session(user_id) is None
        assert take_program_id(messages_body(user_id=user_id), wire()) == (None, False)


def test_codex_session_headers_current_and_older_builds():
    body = {"model": "gpt-5-codex", "instructions": "...", "input": [], "stream": True, "prompt_cache_key": SESSION}
    current = wire(originator="codex_cli_rs", session__id=SESSION, thread__id=SESSION, x__codex__window__id=f"{SESSION}:0")
    assert take_program_id(dict(body), current) == (SESSION, False)
    older = Headers(raw=[(b"originator", b"codex_cli_rs"), (b"session_id", SESSION.encode()), (b"conversation_id", b"c")])
    assert take_program_id(dict(body), older) == (SESSION, False)


def test_litellm_session_header_and_metadata():
    chat = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
    assert take_program_id(dict(chat), wire(x__litellm__session__id="ls-1")) == ("ls-1", False)
    body = {**chat, "metadata": {"session_id": "ls-2", "tags": ["prod"]}}
    assert take_program_id(body, wire()) == ("ls-2", False)
    assert body["metadata"] == {"session_id": "ls-2", "tags": ["prod"]}


def test_routers_affinity_keys_sglang_gateway_and_dynamo():
    chat = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
    assert take_program_id(dict(chat), wire(x__smg__routing__key="rollout-7")) == ("rollout-7", False)
    assert take_program_id(dict(chat), wire(x__dynamo__session__id="research-run-42:researcher")) == (
        "research-run-42:researcher",
        False,
    )


def test_order_maitred_first_then_litellm_claude_code_codex_and_the_routers():
    everything = dict(
        x__program__id="maitred",
        x__litellm__session__id="litellm",
        x__claude__code__session__id="claude-header",
        session__id="codex",
        x__smg__routing__key="smg",
        x__dynamo__session__id="dynamo",
    )
    body = messages_body(session_id="litellm-body", user_id=f"user_ab_account_0-1_session_{SESSION}")
    expected = ["maitred", "litellm", "litellm-body", "claude-header", SESSION, "codex", "smg", "dynamo"]
    seen = []
    for _ in expected:
        found, _ = take_program_id(copy.deepcopy(body), wire(**everything))
        seen.append(found)
        # take away what won, so the next source shows
        if found == "litellm-body":
            del body["metadata"]["session_id"]
        elif found == SESSION:
            del body["metadata"]["user_id"]
        else:
            everything = {k: v for k, v in everything.items() if v != found}
    assert seen == expected
    assert take_program_id(body, wire(**everything)) == (None, False)
    assert take_program_id({**body, "program_id": "own"}, wire(x__program__id="h"))[0] == "own"


def test_invalid_values_are_refused_naming_the_field():
    cases = [
        ({}, wire(x__claude__code__session__id="x" * 300), "x-claude-code-session-id"),
        ({"metadata": {"session_id": 7}}, wire(), "metadata.session_id"),
        ({"metadata": {"session_id": ""}}, wire(), "metadata.session_id"),
        (messages_body(user_id=f"user_ab_account_0_session_{'a' * 300}"), wire(), "metadata.user_id"),
        ({"extra_body": {"program_id": ["p"]}}, wire(), "extra_body.program_id"),
    ]
    for body, headers, field in cases:
        with pytest.raises(HTTPProblem, match=field.replace(".", r"\.")) as refused:
            take_program_id(body, headers)
        assert refused.value.status == 400


def test_maitred_fields_are_stripped_and_the_clients_are_not():
    body = {
        "model": "m",
        "program_id": "p-1",
        "extra_body": {"program_id": "p-2", "top_k": 5},
        "metadata": {"program_id": "p-3", "user_id": f"user_ab_account_0_session_{SESSION}", "session_id": "s"},
    }
    assert take_program_id(body, wire(x__program__id="h")) == ("p-1", True)
    assert body == {
        "model": "m",
        "extra_body": {"top_k": 5},
        "metadata": {"user_id": f"user_ab_account_0_session_{SESSION}", "session_id": "s"},
    }


def test_the_header_list_of_events_is_the_identity_list():
    assert PROGRAM_ID_HEADERS[0] == "x-program-id"
    assert PROGRAM_ID_HEADERS == tuple(s.path[0] for s in ID_SOURCES if s.where == "header")
    assert all(name == name.lower() for name in PROGRAM_ID_HEADERS)


def test_a_claude_code_subagents_request_is_its_child_program():
    """Claude Code 2.1.3xx names the subagent beside the session (``x-claude-code-agent-id``,
    the hooks' ``agent_id``): the request is the child's, the program the hooks name."""
    headers = {"x-claude-code-session-id": "sess-1", CLAUDE_CODE_AGENT_HEADER: "a83733fd361dac0fc"}
    assert take_program_id({}, headers) == (child_program_id("sess-1", "a83733fd361dac0fc"), False)
    assert take_program_id({}, {"x-claude-code-session-id": "sess-1"}) == ("sess-1", False)
    # maitred's own id wins, and another client's id is not turned into a Claude Code child
    assert take_program_id({}, {**headers, "x-program-id": "mine"})[0] == "mine"
    assert take_program_id({}, {"x-litellm-session-id": "l", CLAUDE_CODE_AGENT_HEADER: "a1"})[0] == "l"
