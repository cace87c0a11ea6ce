"""The simulated SGLang worker: every endpoint's shape, caching, eviction, streaming, scripted
tools, bad input, its command line, and registration with sglang-router. Real uvicorn servers
on 127.0.0.1 (in a thread, or a subprocess where the process itself is under test)."""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from maitred.gateway.sglang.client import parse_loads, parse_server_info
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.server import SimWorkerThread, add_arguments, config_from_args, run
from maitred.sim.worker.tokens import count_tokens, render_chat
from tests.helpers import free_port

SYSTEM = "You are a careful coding agent. Follow the repository conventions and explain nothing. " * 4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "mode": {"enum": ["text", "bytes"]}}},
        },
    },
]


@pytest.fixture
def worker() -> Iterator[SimWorkerThread]:
    with SimWorkerThread(
        SimWorkerConfig(port=0, gpu_tokens=200_000, cpu_tokens=400_000, time_scale=50.0, script_tools=True)
    ) as w:
        yield w


def _chat(client: httpx.Client, url: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    response = client.post(url + "/v1/chat/completions", json={"model": "maitred-sim-worker", "messages": messages, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def _words(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


# -- shapes ----------------------------------------------------------------------------------


def test_info_endpoints_have_sglangs_shapes(worker: SimWorkerThread) -> None:
    with httpx.Client() as client:
        assert client.get(worker.url + "/health").status_code == 200
        assert client.get(worker.url + "/health_generate").status_code == 200
        info = client.get(worker.url + "/server_info").json()
        assert client.get(worker.url + "/get_server_info").json()["max_total_num_tokens"] == 200_000
        model = client.get(worker.url + "/model_info").json()
        models = client.get(worker.url + "/v1/models").json()
        loads = client.get(worker.url + "/v1/loads").json()
        core = client.get(worker.url + "/v1/loads", params={"include": "core"}).json()
    capacity = parse_server_info(info)
    assert (capacity.gpu_tokens, capacity.host_tokens, capacity.dp_size) == (200_000, 400_000, 1)
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == 200_000
    assert info["enable_hierarchical_cache"] is True and info["version"] == "0.5.23"
    assert Path(model["model_path"], "tokenizer.json").is_file()
    assert model["simulated"] is True and "not a model" in model["note"]
    assert model["served_model_name"] == models["data"][0]["id"] == "maitred-sim-worker"
    assert models["object"] == "list" and models["data"][0]["owned_by"] == "sglang"
    assert set(loads) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert parse_loads(loads).ranks == 1
    assert {
        "num_running_reqs",
        "num_waiting_reqs",
        "num_used_tokens",
        "token_usage",
        "cache_hit_rate",
        "max_total_num_tokens",
        "memory",
        "queues",
    } <= set(loads["loads"][0])
    assert "memory" not in core["loads"][0] and "num_used_tokens" in core["loads"][0]


def test_metrics_use_sglangs_names(worker: SimWorkerThread) -> None:
    with httpx.Client() as client:
        _chat(client, worker.url, [{"role": "user", "content": "hello there"}])
        text = client.get(worker.url + "/metrics").text
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["sglang:hicache_host_total_tokens"].value == 400_000
    assert samples["sglang:max_total_num_tokens"].value == 200_000
    assert samples["sglang:num_requests_total"].value == 1
    assert samples["sglang:prompt_tokens_total"].value == count_tokens("hello there") + 5
    assert samples["sglang:num_running_reqs"].labels["model_name"] == "maitred-sim-worker"
    assert {"sglang:token_usage", "sglang:cache_hit_rate", "sglang:num_queue_reqs", "sglang:generation_tokens_total"} <= set(
        samples
    )


def test_chat_and_completion_responses_have_openai_shapes(worker: SimWorkerThread) -> None:
    with httpx.Client() as client:
        chat = _chat(client, worker.url, [{"role": "user", "content": "hi"}], max_tokens=7)
        plain = _chat(client, worker.url, [{"role": "user", "content": "hello"}])
        completion = client.post(worker.url + "/v1/completions", json={"prompt": "once upon a time"}).json()
        by_ids = client.post(worker.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3}).json()
    assert chat["object"] == "chat.completion" and chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens"] == 7 == count_tokens(chat["choices"][0]["message"]["content"])
    assert chat["usage"]["prompt_tokens"] == count_tokens("hi") + 3 + 2
    assert plain["choices"][0]["finish_reason"] == "stop"  # no max_tokens: 15 words and the end token
    assert plain["usage"]["completion_tokens"] == 16
    assert completion["object"] == "text_completion" and completion["usage"]["completion_tokens"] == 16
    assert completion["usage"]["prompt_tokens"] == 4 and completion["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert by_ids["usage"]["prompt_tokens"] == 3 and count_tokens(by_ids["choices"][0]["text"]) == 3


def test_generate_prefill_only_and_cached_tokens_details(worker: SimWorkerThread) -> None:
    prompt = _words("ctx", 300)
    with httpx.Client() as client:
        warm = client.post(worker.url + "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 0}}).json()
        real = client.post(worker.url + "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 4}}).json()
        ids = client.post(
            worker.url + "/generate", json={"input_ids": list(range(40)), "sampling_params": {"max_new_tokens": 2}}
        ).json()
    assert warm["text"] == "" and warm["output_ids"] == []
    assert warm["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert warm["meta_info"]["cached_tokens"] == 0 and warm["meta_info"]["prompt_tokens"] == 300
    assert real["meta_info"]["cached_tokens"] == 300
    assert real["meta_info"]["cached_tokens_details"] == {"device": 300, "host": 0}
    assert real["meta_info"]["completion_tokens"] == 4 == len(real["output_ids"]) == count_tokens(real["text"])
    assert ids["meta_info"]["prompt_tokens"] == 40 and "cached_tokens_details" not in ids["meta_info"]


def test_tokenize_renders_messages_as_the_chat_endpoint_does(worker: SimWorkerThread) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "rename the module"}]
    with httpx.Client() as client:
        chat = _chat(client, worker.url, messages, tools=TOOLS, tool_choice="none")
        as_chat = client.post(worker.url + "/v1/tokenize", json={"messages": messages, "tools": TOOLS}).json()
        given = client.post(
            worker.url + "/tokenize", json={"messages": messages, "tools": TOOLS, "add_generation_prompt": False}
        ).json()
        text = client.post(worker.url + "/v1/tokenize", json={"prompt": ["one two", "three"]}).json()
        both = client.post(worker.url + "/v1/tokenize", json={"prompt": "x", "messages": messages})
    assert as_chat["count"] == len(as_chat["tokens"]) == chat["usage"]["prompt_tokens"]
    assert given["tokens"] == as_chat["tokens"][:-2] and given["max_model_len"] == 131_072
    assert text["count"] == [2, 1]
    assert both.status_code == 400 and both.json()["message"].startswith("prompt")


def test_a_chat_prefix_warmed_through_tokenize_and_generate_is_found_by_the_next_request(worker: SimWorkerThread) -> None:
    """The gateway's pre-prefill: tokenize the messages the next request will carry, send them
    as ``input_ids`` with ``max_new_tokens: 0``; the chat request that follows finds them cached."""
    import asyncio

    import aiohttp

    from maitred.gateway.sglang.client import SGLangClient

    shared = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _words("handoff", 300)}]

    async def warm() -> tuple[int, int | None]:
        async with aiohttp.ClientSession() as session:
            backend = SGLangClient(worker.url, lambda: session)
            ids = await backend.tokenize(shared, tools=TOOLS)
            return len(ids), await backend.warmup(ids, priority=3)

    warmed, cached_before = asyncio.run(warm())
    with httpx.Client() as client:
        reply = _chat(client, worker.url, shared + [{"role": "user", "content": "take over"}], tools=TOOLS, tool_choice="none")
    assert cached_before == 0
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == warmed


# -- caching and eviction --------------------------------------------------------------------


def test_a_programs_next_step_reports_its_previous_prompt_and_output_as_cached(worker: SimWorkerThread) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the failing test in parser.py"}]
    with httpx.Client() as client:
        first = _chat(client, worker.url, messages, max_tokens=20)
        messages += [first["choices"][0]["message"], {"role": "user", "content": "now run the whole suite"}]
        second = _chat(client, worker.url, messages, max_tokens=20)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["total_tokens"]
    assert second["usage"]["prompt_tokens"] == render_chat(messages).ids.__len__()


def test_programs_of_one_agent_share_its_system_prompt_and_tools(worker: SimWorkerThread) -> None:
    def first_step(client: httpx.Client, task: str) -> dict[str, Any]:
        return _chat(
            client,
            worker.url,
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}],
            tools=TOOLS,
            tool_choice="none",
        )

    shared = render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}], TOOLS).prefix
    with httpx.Client() as client:
        a = first_step(client, "task one: rename the module")
        b = first_step(client, "task two: add a flag")
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == shared > count_tokens(SYSTEM)


def _three_programs(url: str, *, priorities: tuple[int | None, int | None, int | None] = (None, None, None)) -> tuple[int, int]:
    """A, then A's next step, then B and C, each long enough that C evicts (some of) A or B.
    Returns what A's third step finds cached, and what it would find with nothing evicted."""
    pa, pb, pc = priorities
    with httpx.Client() as client:
        a = [{"role": "user", "content": _words("a", 1000)}]
        extra = {} if pa is None else {"priority": pa}
        reply = _chat(client, url, a, max_tokens=10, **extra)
        a += [reply["choices"][0]["message"], {"role": "user", "content": "go on"}]
        reply = _chat(client, url, a, max_tokens=10, **({} if pa is None else {"priority": 0}))
        resident = reply["usage"]["total_tokens"]
        a += [reply["choices"][0]["message"], {"role": "user", "content": "and finish"}]
        _chat(
            client,
            url,
            [{"role": "user", "content": _words("b", 1200)}],
            max_tokens=10,
            **({} if pb is None else {"priority": pb}),
        )
        _chat(
            client,
            url,
            [{"role": "user", "content": _words("c", 1800)}],
            max_tokens=10,
            **({} if pc is None else {"priority": pc}),
        )
        return int(_chat(client, url, a, max_tokens=10)["usage"]["prompt_tokens_details"]["cached_tokens"]), resident


def test_small_gpu_evicts_the_least_recently_used_program() -> None:
    """Eviction takes what C needs from the tail of A's KV (the least recently used), as a radix
    cache frees leaves: A keeps a shorter prefix."""
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=3_500, time_scale=50.0)) as small:
        cached, resident = _three_programs(small.url)
        assert cached < resident
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=100_000, time_scale=50.0)) as roomy:
        assert _three_programs(roomy.url) == (resident, resident)


def test_priority_eviction_keeps_the_highest_priority_a_prefix_was_ever_given() -> None:
    """A is sent once with priority 10, then with 0: SGLang's ratchet keeps 10, so B (0, newer) is
    evicted instead of A (older)."""
    config = SimWorkerConfig(port=0, gpu_tokens=3_500, time_scale=50.0, radix_eviction_policy="priority")
    with SimWorkerThread(config) as w:
        cached, resident = _three_programs(w.url, priorities=(10, 0, 0))
        assert cached == resident
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=3_500, time_scale=50.0, radix_eviction_policy="priority")) as w:
        cached, resident = _three_programs(w.url, priorities=(0, 10, 0))
        assert cached < resident


def test_evicted_kv_is_loaded_back_from_host_memory_with_hicache() -> None:
    config = SimWorkerConfig(port=0, gpu_tokens=3_000, cpu_tokens=10_000, time_scale=50.0)
    with SimWorkerThread(config) as w, httpx.Client() as client:

        def generate(text: str) -> dict[str, Any]:
            body = {"text": text, "sampling_params": {"max_new_tokens": 8}}
            return client.post(w.url + "/generate", json=body).json()

        a = _words("a", 1400)
        out = generate(a)
        generate(_words("b", 1400))
        generate(_words("c", 1400))
        again = generate(a + out["text"] + " continue")
        host_hits = client.get(w.url + "/metrics").text
    details = again["meta_info"]["cached_tokens_details"]
    assert details["host"] > 0 and details["device"] + details["host"] == again["meta_info"]["cached_tokens"] == 1408
    assert 'sglang:cached_tokens_total{cache_source="host"' in host_hits.replace("engine_type", "").replace(
        'model_name="maitred-sim-worker",pp_rank="0",tp_rank="0",', ""
    ).replace("{,", "{")


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_hicache_write_policy_decides_when_kv_is_copied_to_host_memory(policy: str) -> None:
    """write_through copies a program's KV to host memory once it is cached; write_back only when
    it is evicted from the GPU. Either way the evicted program finds it in host memory."""
    config = SimWorkerConfig(port=0, gpu_tokens=3_000, cpu_tokens=10_000, time_scale=50.0, hicache_write_policy=policy)
    with SimWorkerThread(config) as w, httpx.Client() as client:

        def generate(text: str) -> dict[str, Any]:
            return client.post(w.url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 8}}).json()

        def host_used() -> float:
            samples = {
                s.name: s.value for f in text_string_to_metric_families(client.get(w.url + "/metrics").text) for s in f.samples
            }
            return samples["sglang:hicache_host_used_tokens"]

        info = client.get(w.url + "/server_info").json()
        a = _words("a", 1400)
        out = generate(a)
        cached_only = host_used()
        generate(_words("b", 1400))
        generate(_words("c", 1400))
        evicted = host_used()
        again = generate(a + out["text"] + " continue")
    assert info["hicache_write_policy"] == policy and f"--hicache-write-policy {policy}" in info["launch_command"]
    assert parse_server_info(info).write_back is (policy == "write_back")
    assert cached_only == (0 if policy == "write_back" else 1408)
    assert evicted > 0  # write_back: what C's request pushed off the GPU
    assert again["meta_info"]["cached_tokens_details"]["host"] > 0


@pytest.mark.parametrize(("cpu_tokens", "policy"), [(0, "write_through"), (10_000, "write_through"), (10_000, "write_back")])
def test_kv_events_tell_what_the_next_request_will_find_cached(cpu_tokens: int, policy: str) -> None:
    """With --kv-events-config the double publishes SGLang-format KV events; the residency the
    tracker folds from them for a session (on the GPU, or in host memory with HiCache) is what
    that session's next request finds cached (to the 16-token block), before and after eviction.
    With write-through the host holds a copy of the whole context; with write-back only what
    was evicted, stored under the GPU part it continues."""
    pytest.importorskip("zmq", reason="the kv-events extra (pyzmq) is not installed")
    from maitred.gateway.sglang.kv_events import KVEventSubscriber, endpoints_from_server_info

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = SimWorkerConfig(
        port=0,
        gpu_tokens=3_500,
        cpu_tokens=cpu_tokens,
        time_scale=50.0,
        hicache_write_policy=policy,
        kv_events_config=json.dumps({"publisher": "zmq", "endpoint": endpoint}),
    )
    system = {"role": "system", "content": SYSTEM}
    with SimWorkerThread(config) as w, httpx.Client() as client:
        info = client.get(w.url + "/server_info").json()
        assert info["kv_events"]["block_size"] == 16 and endpoints_from_server_info(w.url, info) == [endpoint]
        with KVEventSubscriber(endpoint) as sub:
            probes = 0
            while sub.tracker.batches == 0:  # PUB drops events until the subscription has propagated
                client.post(w.url + "/generate", json={"text": f"probe {probes} " * 10, "sampling_params": {"max_new_tokens": 1}})
                probes += 1
                assert probes < 500, "no KV events arrived"

            def step(session: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
                before = sub.tracker.batches
                reply = _chat(client, w.url, messages, max_tokens=10, session_id=session)
                deadline = time.monotonic() + 30
                while sub.tracker.batches == before:
                    assert time.monotonic() < deadline, "no KV events for a request"
                    time.sleep(0.01)
                return reply

            a = [system, {"role": "user", "content": _words("a", 1000)}]
            first = step("prog-a", a)
            assert sub.tracker.session_tokens("prog-a") == first["usage"]["total_tokens"] // 16 * 16
            a += [first["choices"][0]["message"], {"role": "user", "content": "go on"}]
            b = step("prog-b", [system, {"role": "user", "content": _words("b", 1200)}])
            c = step("prog-c", [system, {"role": "user", "content": _words("c", 1500)}])
            on_gpu = sub.tracker.session_tokens("prog-a")
            on_host = sub.tracker.session_tokens("prog-a", "CPU_PINNED")
            held = sub.tracker.held_tokens("GPU") + sub.tracker.held_tokens("CPU_PINNED")
            computed = sum(r["usage"]["total_tokens"] for r in (first, b, c))
            cached = step("prog-a", a)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert on_gpu < first["usage"]["total_tokens"]  # C evicted part of A from the GPU
    assert (on_host > on_gpu) == bool(cpu_tokens)  # HiCache kept a host copy
    assert 0 <= cached - max(on_gpu, on_host) < 16
    if policy == "write_back":  # nothing is in both media: the host holds only what left the GPU
        assert held <= computed
    assert sub.malformed == 0 and sub.tracker.orphans == 0


def test_time_scale_speeds_the_engine_clock() -> None:
    """The same request on an idle worker takes the same engine time; ``e2e_latency`` is that
    time divided by the scale."""
    latencies = []
    for scale in (1.0, 8.0):
        with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=scale)) as w:
            body = {"text": _words("t", 2000), "sampling_params": {"max_new_tokens": 20}}
            latencies.append(httpx.post(w.url + "/generate", json=body, timeout=60).json()["meta_info"]["e2e_latency"])
    assert latencies[0] > 0
    assert latencies[0] / latencies[1] == pytest.approx(8.0, rel=1e-4)


def test_loads_count_running_requests_while_they_run() -> None:
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=0.5)) as w:
        results: list[int] = []

        def one(i: int) -> None:
            body = {"text": _words(f"r{i}x", 100), "sampling_params": {"max_new_tokens": 100}}
            results.append(httpx.post(w.url + "/generate", json=body, timeout=120).status_code)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        seen = 0
        while seen < 3 and time.monotonic() < deadline:
            seen = parse_loads(httpx.get(w.url + "/v1/loads").json()).running
        busy = httpx.get(w.url + "/v1/loads").json()["loads"][0]
        for t in threads:
            t.join(120)
        idle = parse_loads(httpx.get(w.url + "/v1/loads").json())
    assert seen == 3 and busy["num_used_tokens"] > 0
    assert results == [200, 200, 200] and (idle.running, idle.used_tokens) == (0, 0)


# -- streaming -------------------------------------------------------------------------------


def _sse(client: httpx.Client, url: str, body: dict[str, Any]) -> list[Any]:
    events = []
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_streaming_chat_delivers_tokens_progressively_and_usage_at_the_end() -> None:
    messages = [{"role": "user", "content": "write a long answer"}]
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=1.0)) as w, httpx.Client() as client:
        events = _sse(
            client,
            w.url + "/v1/chat/completions",
            {"messages": messages, "max_tokens": 200, "stream": True, "stream_options": {"include_usage": True}},
        )
        whole = _chat(client, w.url, messages, max_tokens=200)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(contents) > 1
    assert "".join(contents) == whole["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 200
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == chunks[-1]["usage"]["prompt_tokens"]


def test_streaming_completions_and_generate(worker: SimWorkerThread) -> None:
    with httpx.Client() as client:
        completion = _sse(client, worker.url + "/v1/completions", {"prompt": "abc", "max_tokens": 30, "stream": True})
        generate = _sse(
            client, worker.url + "/generate", {"text": "abc", "sampling_params": {"max_new_tokens": 30}, "stream": True}
        )
    assert completion[-1] == generate[-1] == "[DONE]"
    text = "".join(c["choices"][0]["text"] for c in completion[:-1])
    assert count_tokens(text) == 30 and completion[-2]["choices"][0]["finish_reason"] == "length"
    last = generate[-2]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 30} and len(last["output_ids"]) == 30
    assert last["text"] == text  # /generate streams the whole text so far, SGLang's default
    assert all(g["meta_info"]["finish_reason"] is None for g in generate[:-2])


def test_a_stream_the_client_drops_is_aborted() -> None:
    """SGLang aborts a request whose client disconnects; so does the double (this one would
    otherwise decode for minutes)."""
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=1.0)) as w:
        with (
            httpx.Client() as client,
            client.stream(
                "POST",
                w.url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "go"}], "max_tokens": 20_000, "stream": True},
            ) as response,
        ):
            lines = response.iter_lines()  # kept: a dropped iterator closes the connection when collected
            next(lines)
            assert parse_loads(httpx.get(w.url + "/v1/loads").json()).running == 1
        deadline = time.monotonic() + 30
        while parse_loads(httpx.get(w.url + "/v1/loads").json()).running:
            assert time.monotonic() < deadline, "the dropped stream kept running"
            time.sleep(0.05)
        assert (
            _chat(httpx.Client(), w.url, [{"role": "user", "content": "next"}], max_tokens=3)["usage"]["completion_tokens"] == 3
        )


def test_streamed_tool_calls_come_as_sglang_sends_them(worker: SimWorkerThread) -> None:
    """Id and name first, then the arguments with no id or name; a client joins them."""
    messages = [{"role": "user", "content": "list files"}]
    with httpx.Client() as client:
        events = _sse(client, worker.url + "/v1/chat/completions", {"messages": messages, "tools": TOOLS, "stream": True})
        whole = _chat(client, worker.url, messages, tools=TOOLS)["choices"][0]["message"]["tool_calls"][0]
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in events[:-1] if c["choices"][0]["delta"].get("tool_calls")]
    assert [(d["id"] is not None, d["function"]["name"]) for d in deltas] == [(True, "bash"), (False, None)]
    assert (
        deltas[0]["id"] == whole["id"] and "".join(d["function"]["arguments"] for d in deltas) == whole["function"]["arguments"]
    )
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


# -- scripted tools --------------------------------------------------------------------------


def _run_loop(client: httpx.Client, url: str, task: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    replies = []
    for _ in range(10):
        reply = _chat(client, url, messages, tools=TOOLS)
        replies.append(reply)
        message = reply["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"ran {call['function']['name']}: ok"})
    return messages, replies


def test_script_tools_calls_tools_for_a_few_steps_then_answers(worker: SimWorkerThread) -> None:
    with httpx.Client() as client:
        messages, replies = _run_loop(client, worker.url, "tidy the repo")
        again, _ = _run_loop(client, worker.url, "tidy the repo")
    reasons = [r["choices"][0]["finish_reason"] for r in replies]
    assert reasons == ["tool_calls", "tool_calls", "tool_calls", "stop"]
    calls = [r["choices"][0]["message"]["tool_calls"][0] for r in replies[:3]]
    assert [c["function"]["name"] for c in calls] == ["bash", "read_file", "bash"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "command-0"}
    assert json.loads(calls[1]["function"]["arguments"]) == {"path": "path-1", "mode": "text"}
    assert replies[-1]["choices"][0]["message"]["content"] == "Finished after 3 tool calls ."
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies[1:]] == [
        r["usage"]["total_tokens"] for r in replies[:-1]
    ]
    assert again == messages  # deterministic


def test_a_langchain_agent_runs_its_tool_loop_against_the_sim_worker(worker: SimWorkerThread) -> None:
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (the langgraph extra)")
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    calls: list[tuple[Any, ...]] = []

    @tool
    def grep(pattern: str, max_hits: int = 5) -> str:
        """Search the repository."""
        calls.append(("grep", pattern))
        return f"3 hits for {pattern}"

    @tool
    def read(path: str) -> str:
        """Read a file."""
        calls.append(("read", path))
        return "contents"

    for streaming in (False, True):  # streamed tool calls are joined by the client
        calls.clear()
        model = ChatOpenAI(base_url=worker.url + "/v1", api_key="sim", model="maitred-sim-worker", streaming=streaming)
        agent = create_agent(model, tools=[grep, read], system_prompt="You search code.")
        out = agent.invoke({"messages": [{"role": "user", "content": f"find the bug (streaming={streaming})"}]})
        assert calls == [("grep", "pattern-0"), ("read", "path-1"), ("grep", "pattern-2")]
        assert out["messages"][-1].content == "Finished after 3 tool calls ."


def test_an_openai_agents_sdk_agent_runs_its_tool_loop_against_the_sim_worker(worker: SimWorkerThread) -> None:
    pytest.importorskip("agents", reason="openai-agents is not installed (the openai-agents extra)")
    import asyncio

    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    cities: list[str] = []

    @function_tool
    def lookup(city: str) -> str:
        """Look up the weather."""
        cities.append(city)
        return "sunny"

    async def main() -> Any:
        client = AsyncOpenAI(base_url=worker.url + "/v1", api_key="sim")
        model = OpenAIChatCompletionsModel(model="maitred-sim-worker", openai_client=client)
        agent = Agent(name="weather", instructions="Answer about the weather.", tools=[lookup], model=model)
        try:
            # tracing off for this run only: the default exporter would call out to the vendor
            return await Runner.run(agent, "weather in Paris?", max_turns=10, run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()

    result = asyncio.run(main())
    assert cities == ["city-0", "city-1", "city-2"] and result.final_output == "Finished after 3 tool calls ."


def test_tool_choice_steers_the_script(worker: SimWorkerThread) -> None:
    forced = {"type": "function", "function": {"name": "read_file"}}
    with httpx.Client() as client:
        named = _chat(client, worker.url, [{"role": "user", "content": "x"}], tools=TOOLS, tool_choice=forced)
        none = _chat(client, worker.url, [{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="none")
        unknown = client.post(
            worker.url + "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "x"}],
                "tools": TOOLS,
                "tool_choice": {"type": "function", "function": {"name": "rm"}},
            },
        )
    assert named["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    assert none["choices"][0]["finish_reason"] == "stop"
    assert unknown.status_code == 400 and "tool_choice.function.name" in unknown.json()["message"]


def test_without_script_tools_a_tools_request_gets_plain_text() -> None:
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=50.0)) as w, httpx.Client() as client:
        reply = _chat(client, w.url, [{"role": "user", "content": "x"}], tools=TOOLS)
    assert reply["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in reply["choices"][0]["message"]


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", b"{not json", "body"),
        ("/v1/chat/completions", b"[1, 2]", "body"),
        ("/v1/chat/completions", {"messages": "hello"}, "messages"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "priority": "high"}, "priority"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "session_id": 7}, "session_id"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools[0].function.name",
        ),
        ("/v1/completions", {"prompt": 12}, "prompt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 600_000}, "max_tokens"),
        ("/generate", {"sampling_params": {"max_new_tokens": 1}}, "text"),
        ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ("/generate", {"text": "x", "sampling_params": [1]}, "sampling_params"),
        ("/generate", {"input_ids": [1, "two"]}, "input_ids"),
        (
            "/v1/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "no"},
            "add_generation_prompt",
        ),
        ("/v1/tokenize", {"prompt": [1, 2]}, "prompt"),
    ],
)
def test_bad_input_gets_400_naming_the_field(worker: SimWorkerThread, path: str, body: Any, field: str) -> None:
    with httpx.Client() as client:
        if isinstance(body, bytes):
            response = client.post(worker.url + path, content=body, headers={"content-type": "application/json"})
        else:
            response = client.post(worker.url + path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()
        message = error["error"]["message"] if path == "/generate" else error["message"]
        assert message.startswith(field), message
        assert _chat(client, worker.url, [{"role": "user", "content": "still fine"}])["choices"][0]["message"]["content"]


def test_an_engine_failure_fails_requests_loudly_and_turns_health_red() -> None:
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=1.0)) as w, httpx.Client() as client:
        streams: list[Any] = []

        def stream() -> None:
            streams.extend(
                _sse(
                    client,
                    w.url + "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "long"}], "max_tokens": 5_000, "stream": True},
                )
            )

        reader = threading.Thread(target=stream)
        reader.start()
        deadline = time.monotonic() + 30
        while not w.sim.engine.worker.running:
            assert time.monotonic() < deadline
            time.sleep(0.01)

        def broken(now: float) -> list[Any]:
            raise RuntimeError("model bug")

        w.sim.engine.worker.advance = broken
        reader.join(30)
        after = client.post(w.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        health = client.get(w.url + "/health").status_code
    assert streams[-1] == "[DONE]" and "model bug" in streams[-2]["error"]["message"]
    assert after.status_code == 500 and "model bug" in after.json()["error"]["message"]
    assert health == 503


def test_bad_loads_section_is_refused(worker: SimWorkerThread) -> None:
    response = httpx.get(worker.url + "/v1/loads", params={"include": "core,everything"})
    assert response.status_code == 400 and "include" in response.json()["message"]


# -- command line ----------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maitred sim-worker")
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--gpu-tokens", "0"], "--gpu-tokens"),
        (["--gpu-tokens", "-5"], "--gpu-tokens"),
        (["--gpu-tokens", "lots"], "--gpu-tokens"),
        (["--cpu-tokens", "-1"], "--cpu-tokens"),
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "nan"], "--time-scale"),
        (["--time-scale", "inf"], "--time-scale"),
        (["--time-scale", "-2"], "--time-scale"),
        (["--port", "0"], "--port"),
        (["--port", "70000"], "--port"),
        (["--radix-eviction-policy", "lfu"], "--radix-eviction-policy"),
        (["--hicache-write-policy", "write_through_selective"], "--hicache-write-policy"),
    ],
)
def test_cli_refuses_bad_flags_naming_them(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse(argv)
    assert exited.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_cli_defaults_and_values() -> None:
    config = config_from_args(_parse(["--gpu-tokens", "1_000", "--cpu-tokens", "0", "--time-scale", "2.5", "--script-tools"]))
    assert (config.gpu_tokens, config.cpu_tokens, config.time_scale, config.script_tools) == (1000, 0, 2.5, True)
    assert (config.host, config.port, config.hicache_write_policy) == ("127.0.0.1", 30000, "write_through")
    assert config_from_args(_parse(["--hicache-write-policy", "write_back"])).hicache_write_policy == "write_back"
    with pytest.raises(ValueError, match="time_scale"):
        SimWorkerConfig(time_scale=math.nan)
    with pytest.raises(ValueError, match="hicache_write_policy"):
        SimWorkerConfig(hicache_write_policy="write_around")


def test_the_cli_module_imports_nothing_heavy() -> None:
    """``maitred`` builds every subcommand's parser on every call: the server stack loads only when
    the sim-worker runs."""
    probe = (
        "import sys, maitred.sim.worker.config, maitred.sim.worker.server; "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'prometheus_client', 'zmq') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_refuses_a_missing_profile_and_a_busy_port(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--profile"):
        run(_parse(["--profile", str(tmp_path / "missing.json"), "--port", str(free_port())]))
    bad = tmp_path / "bad.json"
    bad.write_text('{"step_base_s": -1}')
    with SimWorkerThread() as busy:
        with pytest.raises(ValueError, match=f"--port {busy.config.port}"):
            run(_parse(["--port", str(busy.config.port)]))
    with pytest.raises(ValueError, match="--profile"):
        create_app(SimWorkerConfig(profile=str(bad)))
    for config in ("{", '{"publisher": "kafka"}', '{"publisher": "zmq", "endpoint": "ipc:///tmp/x"}'):
        with pytest.raises(ValueError, match="--kv-events-config"):
            create_app(SimWorkerConfig(kv_events_config=config))


def test_the_module_runs_as_a_process_and_stops_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "maitred.sim.worker", "--port", str(port), "--gpu-tokens", "20000", "--time-scale", "10"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "sim-worker process did not come up"
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/server_info").json()["max_total_num_tokens"] == 20_000
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM) and "test double" in err  # uvicorn re-raises the signal it stopped on


# -- sglang-router ---------------------------------------------------------------------------


def test_sglang_router_registers_two_sim_workers_and_routes_through_them(tmp_path: Path) -> None:
    pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router)")
    log_path = tmp_path / "router.log"

    def log_tail() -> str:
        return log_path.read_text(errors="replace")[-3000:]

    with (
        SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=50.0)) as w1,
        SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=50_000, time_scale=50.0)) as w2,
    ):
        port = free_port()
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        log_file = log_path.open("wb")
        router = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_router.launch_router",
                "--worker-urls",
                w1.url,
                w2.url,
                "--policy",
                "cache_aware",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            workers: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                assert router.poll() is None, f"sglang-router exited:\n{log_tail()}"
                try:
                    workers = httpx.get(url + "/workers", timeout=2).json()["workers"]
                except (httpx.HTTPError, ValueError, KeyError):
                    workers = []
                if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                    break
                time.sleep(0.2)
            assert sorted(w["url"] for w in workers) == sorted([w1.url, w2.url]), log_tail()
            assert {w["metadata"]["model_path"] for w in workers} == {w1.config.model_path}
            reply = httpx.post(
                url + "/v1/chat/completions",
                timeout=30,
                json={
                    "model": "maitred-sim-worker",
                    "messages": [{"role": "user", "content": "through the router"}],
                    "max_tokens": 5,
                },
            )
            assert reply.status_code == 200, f"{reply.text}\n{log_tail()}"
            assert reply.json()["usage"]["completion_tokens"] == 5
        finally:
            router.terminate()
            router.wait(30)
            log_file.close()


def test_a_long_running_worker_forgets_conversations_it_holds_no_kv_for() -> None:
    """Every conversation ever seen is indexed; once the index outgrows its bound, those whose KV
    the engine dropped are forgotten, so memory follows the KV capacity, not the traffic."""
    import asyncio

    from maitred.sim.engine import WorkerModel
    from maitred.sim.profile import EngineProfile
    from maitred.sim.worker.engine import RealtimeEngine
    from maitred.sim.worker.tokens import render_text

    async def run() -> tuple[int, int, int]:
        engine = RealtimeEngine(WorkerModel("w", EngineProfile(), 2_000, 0), 1_000.0, prune_floor_tokens=5_000)
        engine.start()
        try:
            for i in range(60):
                prompt = render_text(_words(f"p{i}x", 400))
                await engine.submit(prompt, [1, 2, 3]).done.wait()
            return engine.index.tokens_held, len(engine.index), len(engine.worker.segments)
        finally:
            await engine.stop()

    held, conversations, segments = asyncio.run(run())
    assert held <= 2 * 5_000 + 403 and conversations < 30 and segments == conversations


def test_conversation_index_follows_a_radix_caches_view_of_prompts() -> None:
    from maitred.sim.worker.engine import ConversationIndex
    from maitred.sim.worker.tokens import Prompt

    index = ConversationIndex()
    a1 = Prompt(list(range(100, 140)), 0, "")
    a = index.resolve(a1, busy=())
    index.record(a, "", a1.ids + [7, 8])
    assert index.resolve(Prompt(a1.ids + [7, 8, 9, 10], 0, ""), busy=()) == a  # extends prompt + output
    assert index.resolve(Prompt(a1.ids[:20], 0, ""), busy=()) == a  # a prefix of it (a retry)
    assert index.resolve(Prompt(a1.ids[:30] + [1, 2, 3], 0, ""), busy=()) != a  # diverges: a new conversation
    assert index.resolve(Prompt(a1.ids + [7, 8, 9], 0, ""), busy={a}) != a  # a is mid-request: a fork
    assert index.resolve(Prompt(a1.ids + [7, 8, 9], 0, "other-agent"), busy=()) != a
    short = Prompt([5, 6, 7], 0, "")
    s = index.resolve(short, busy=())
    index.record(s, "", short.ids + [1])
    assert index.resolve(Prompt([5, 6, 7, 1, 9], 0, ""), busy=()) == s  # shorter than a page
    index.forget(a)
    assert index.resolve(Prompt(a1.ids + [7, 8, 9], 0, ""), busy=()) != a
    assert index.tokens_held == 4


def test_the_token_cache_is_bounded_by_tokens_least_recently_used_out_first() -> None:
    from maitred.sim.worker.tokens import _TokenCache, tokenize

    cache = _TokenCache(max_tokens=10)
    assert list(cache("a b c d")) == tokenize("a b c d")
    cache("e f g h")
    cache("a b c d")  # used again: now the most recent
    cache("i j k")  # 11 tokens held: the least recently used ("e f g h") goes
    assert list(cache._entries) == ["a b c d", "i j k"] and cache._tokens == 7
    cache(" ".join("x" * 11))  # longer than the whole cache: answered, not kept
    assert cache._tokens == 7
