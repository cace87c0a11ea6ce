"""maitred's Dynamo component on a real stack: two ``dynamo.mocker`` workers, Dynamo's frontend
and ``python -m maitred.gateway.dynamo``, all on 127.0.0.1 with file discovery and the ZMQ event
plane (``maitred.harness.dynamo_stack``)."""

import time
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from maitred.harness.dynamo_stack import MockerSpec, Stack, start_stack
from tests.dynamo.helpers import chat, decided, words

# Building the Dynamo venv (first run only) and starting the stack outlast the default timeout.
pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def stack(dynamo_python, tmp_path_factory) -> Iterator[Stack]:
    with ExitStack() as es:
        yield start_stack(
            "maitred",
            dynamo_python,
            tmp_path_factory.mktemp("dynamo"),
            es,
            mocker=MockerSpec(workers=2),
            maitred_args=["--priority"],
        )


def program(stack: Stack, pid: str) -> httpx.Response:
    assert stack.admin_url is not None
    return httpx.get(f"{stack.admin_url}/v1/programs/{pid}", timeout=10)


def test_each_turn_goes_to_the_worker_maitred_chose_and_the_program_stays_there(stack):
    messages = [{"role": "system", "content": words(1, 200)}]
    chosen = []
    for turn in range(3):
        messages.append({"role": "user", "content": words(10 + turn, 40)})
        answer = chat(stack.url, messages, session="pinned")
        d = decided(answer)
        assert d["program_id"] == "pinned"
        assert d["served_by"] == d["worker_id"]  # the KV router sent it where the core said
        assert isinstance(d["priority"], int)  # --priority: the core's eviction priority went as routing.priority
        assert program(stack, "pinned").json()["worker"] == str(d["worker_id"])
        chosen.append(d["worker_id"])
        messages.append({"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"] or "ok"})
    assert len(set(chosen)) == 1
    assert program(stack, "pinned").json()["last_cached_tokens"] > 0  # later turns found the earlier prefix there


def test_the_answer_s_usage_goes_back_into_the_core(stack):
    answer = chat(stack.url, [{"role": "user", "content": words(3, 120)}], session="usage", max_tokens=12)
    usage = answer.json()["usage"]
    seen = program(stack, "usage").json()
    assert seen["last_prompt_tokens"] == usage["prompt_tokens"]
    assert seen["last_cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert seen["context_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_tool_events_from_the_middleware_reach_the_component(stack):
    chat(stack.url, [{"role": "user", "content": words(4, 30)}], session="tooling").raise_for_status()
    events = [{"type": "tool.start", "ts": _now(), "program_id": "tooling", "call_id": "c1", "tool": "Bash"}]
    assert program(stack, "tooling").json()["tool"] is None
    posted = httpx.post(stack.admin_url + "/v1/events", json=events, timeout=10)
    assert posted.status_code == 200 and posted.json()["accepted"] == 1, posted.text
    seen = program(stack, "tooling").json()
    assert seen["phase"] == "acting" and seen["tool"]["tool"] == "Bash"
    events = [{"type": "tool.end", "ts": _now(), "program_id": "tooling", "call_id": "c1", "status": "ok"}]
    httpx.post(stack.admin_url + "/v1/events", json=events, timeout=10).raise_for_status()
    tools = httpx.get(stack.admin_url + "/v1/stats/tools", timeout=10).json()["tools"]
    assert {"tool": "Bash", "n": 1} in [{"tool": t["tool"], "n": t["n"]} for t in tools]  # readiness learns from it


def test_session_final_ends_the_program_without_calling_a_worker(stack):
    chat(stack.url, [{"role": "user", "content": words(5, 30)}], session="finished").raise_for_status()
    assert program(stack, "finished").status_code == 200
    chat(stack.url, [{"role": "user", "content": "ok"}], session="finished", **{"x-dynamo-session-final": "true"})
    assert program(stack, "finished").status_code == 404


def test_a_request_without_a_session_is_served_and_forgotten(stack):
    before = {p["program_id"] for p in httpx.get(stack.admin_url + "/v1/programs", timeout=10).json()}
    answer = chat(stack.url, [{"role": "user", "content": words(6, 30)}], session=None)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    after = {p["program_id"] for p in httpx.get(stack.admin_url + "/v1/programs", timeout=10).json()}
    assert after == before


def _now() -> float:
    return time.time()


@pytest.mark.parametrize("header", ["x-session-id", "x-claude-code-session-id"])
def test_the_other_session_headers_dynamo_reads_name_the_program_too(stack, header):
    pid = f"via-{header}"
    answer = chat(stack.url, [{"role": "user", "content": words(7, 30)}], session=None, **{header: pid})
    assert decided(answer)["program_id"] == pid
    assert program(stack, pid).status_code == 200
