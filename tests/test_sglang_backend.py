"""SGLang worker backend: parsing SGLang 0.5.23's payloads, and the client against real servers.

The fixtures below are shaped exactly like SGLang 0.5.23's answers (abridged: only keys are
dropped, none invented), taken from its source:
- /server_info: python/sglang/srt/entrypoints/http_server.py (``server_info``: resolved server
  arguments + scheduler start-up info + ``internal_states`` + ``version`` + ``frontend``),
  python/sglang/srt/managers/scheduler.py (``get_init_info``),
  python/sglang/srt/managers/scheduler_components/internal_state.py and memory_usage.py.
- /v1/loads: python/sglang/srt/entrypoints/v1_loads.py (the envelope) and
  python/sglang/srt/managers/load_snapshot.py (``LoadSnapshot.to_dict``).
- /generate meta_info: python/sglang/srt/managers/tokenizer_manager.py and
  scheduler_components/output_streamer.py (``cached_tokens_details``).
- chat usage: python/sglang/srt/entrypoints/openai/protocol.py (``UsageInfo``,
  ``PromptTokensDetails``).
- /metrics: python/sglang/srt/observability/metrics_collector.py (metric names and labels).
"""

import asyncio
import copy
import threading
import time
from typing import Any

import aiohttp
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response

from maitred.gateway.sglang.client import (
    SGLangClient,
    WorkerCapacity,
    WorkerLoad,
    WorkerProtocolError,
    cached_tokens,
    parse_host_capacity,
    parse_loads,
    parse_server_info,
)
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.server import SimWorkerThread
from tests.helpers import free_port

SERVER_INFO: dict[str, Any] = {
    "model_path": "Qwen/Qwen2.5-7B-Instruct",
    "tokenizer_path": "Qwen/Qwen2.5-7B-Instruct",
    "served_model_name": "Qwen/Qwen2.5-7B-Instruct",
    "host": "0.0.0.0",
    "port": 30000,
    "tp_size": 1,
    "pp_size": 1,
    "dp_size": 1,
    "page_size": 1,
    "context_length": None,
    "mem_fraction_static": 0.871,
    "max_running_requests": None,
    "chunked_prefill_size": 8192,
    "enable_metrics": True,
    "enable_cache_report": True,
    "enable_hierarchical_cache": True,
    "hicache_ratio": 2.0,
    "hicache_size": 0,
    "hicache_write_policy": "write_through",
    "radix_eviction_policy": "priority",
    "enable_priority_scheduling": False,
    "kv_events_config": None,
    "launch_command": "python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B-Instruct --enable-metrics "
    "--enable-cache-report --enable-hierarchical-cache --radix-eviction-policy priority",
    "status": "ready",
    "max_total_num_tokens": 919_824,
    "max_req_input_len": 32_762,
    "startup_time": 1764500000.12,
    "kv_events": None,
    "internal_states": [
        {
            "world_size": 1,
            "startup_time": 1764500000.12,
            "effective_max_running_requests_per_dp": 4096,
            "last_gen_throughput": 0.0,
            "memory_usage": {
                "weight": 15.27,
                "kvcache": 52.746,
                "startup_available": 70.112,
                "token_capacity": 919_824,
                "token_capacity_swa": None,
                "graph": {"decode": 0.512},
            },
        }
    ],
    "version": "0.5.23",
    "frontend": "python",
}


def _server_info_dp2() -> dict[str, Any]:
    body = copy.deepcopy(SERVER_INFO)
    body.update(dp_size=2, enable_hierarchical_cache=False, hicache_ratio=None, max_total_num_tokens=450_000)
    state = body["internal_states"][0]
    state["memory_usage"]["token_capacity"] = 450_000
    body["internal_states"] = [state, copy.deepcopy(state)]
    return body


def _load(rank: int, running: int, waiting: int, used: int, usage: float, hit: float) -> dict[str, Any]:
    return {
        "timestamp": 1764500100.5,
        "dp_rank": rank,
        "num_running_reqs": running,
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": used,
        "num_total_tokens": used,
        "num_active_tokens": used,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": 450_000,
        "max_running_requests": 4096,
        "token_usage": usage,
        "gen_throughput": 812.4,
        "cache_hit_rate": hit,
        "utilization": 0.4,
        "total_prefill_uncached_tokens": 120_000,
        "total_prefill_busy_us": 3_200_000,
        "decode_moments": None,
        "memory": {"weight_gb": 15.27, "kv_cache_gb": 25.8, "graph_gb": 0.512, "token_capacity": 450_000},
        "queues": {"waiting": waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }


LOADS: dict[str, Any] = {
    "timestamp": "2026-11-30T12:00:00.000000+00:00",
    "version": "0.5.23",
    "accelerator": "NVIDIA H100 80GB HBM3",
    "num_accelerators": 1,
    "loads": [_load(0, 3, 1, 120_000, 0.27, 0.5), _load(1, 5, 0, 200_000, 0.44, 0.7)],
}

GENERATE_RESPONSE: dict[str, Any] = {
    "text": " The answer",
    "output_ids": [576, 4226],
    "meta_info": {
        "id": "5c1f0e0a8b2d4e6f",
        "finish_reason": {"type": "length", "length": 2},
        "prompt_tokens": 1200,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": 2,
        "cached_tokens": 1024,
        "cached_tokens_details": {"device": 768, "host": 256},
        "e2e_latency": 0.061,
    },
}

CHAT_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-8d6f",
    "object": "chat.completion",
    "created": 1764500200,
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi.", "reasoning_content": None},
            "logprobs": None,
            "finish_reason": "stop",
            "matched_stop": 151645,
        }
    ],
    "usage": {
        "prompt_tokens": 2048,
        "total_tokens": 2051,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 1920},
        "reasoning_tokens": 0,
    },
    "metadata": {"weight_version": "default"},
}

LABELS = 'engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"'
METRICS_TEXT = f"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{LABELS},dp_rank="0"}} 3.0
sglang:num_running_reqs{{{LABELS},dp_rank="1"}} 5.0
# HELP sglang:hicache_host_total_tokens Total capacity of the host KV cache in tokens.
# TYPE sglang:hicache_host_total_tokens gauge
sglang:hicache_host_total_tokens{{{LABELS},dp_rank="0"}} 1839648.0
sglang:hicache_host_total_tokens{{{LABELS},dp_rank="1"}} 1839648.0
"""


# -- parsing ---------------------------------------------------------------------------------


def test_server_info_gives_gpu_capacity_from_internal_states_and_host_from_the_hicache_ratio() -> None:
    assert parse_server_info(SERVER_INFO) == WorkerCapacity(919_824, 1_839_648, 1, "Qwen/Qwen2.5-7B-Instruct", "write_through")


def test_server_info_says_whether_the_host_pool_is_written_back_or_mirrors_the_gpu() -> None:
    """``--hicache-write-policy``: only write_back with HiCache on makes host memory add to the GPU's."""
    assert parse_server_info(SERVER_INFO).write_policy == "write_through"
    assert parse_server_info(SERVER_INFO).write_back is False
    written_back = parse_server_info(dict(SERVER_INFO, hicache_write_policy="write_back"))
    assert (written_back.write_policy, written_back.write_back) == ("write_back", True)
    assert parse_server_info(dict(SERVER_INFO, hicache_write_policy="write_through_selective")).write_back is False
    hicache_off = parse_server_info(dict(SERVER_INFO, hicache_write_policy="write_back", enable_hierarchical_cache=False))
    assert (hicache_off.write_policy, hicache_off.write_back) == (None, False)
    not_said = parse_server_info({k: v for k, v in SERVER_INFO.items() if k != "hicache_write_policy"})
    assert (not_said.write_policy, not_said.write_back) == (None, False)


def test_server_info_sums_data_parallel_ranks() -> None:
    capacity = parse_server_info(_server_info_dp2())
    assert capacity == WorkerCapacity(900_000, 0, 2, "Qwen/Qwen2.5-7B-Instruct")


def test_server_info_without_internal_states_scales_the_per_rank_max_total_num_tokens() -> None:
    body = _server_info_dp2()
    del body["internal_states"]
    assert parse_server_info(body).gpu_tokens == 900_000


def test_host_capacity_from_a_ratio_is_rounded_not_truncated() -> None:
    body = dict(SERVER_INFO, hicache_ratio=2047 / 1021, max_total_num_tokens=1021, internal_states=[])
    assert parse_server_info(body).host_tokens == 2047  # int() would give 2046


def test_host_capacity_is_unknown_when_the_pool_is_sized_in_gigabytes() -> None:
    body = dict(SERVER_INFO, hicache_size=64)
    assert parse_server_info(body).host_tokens is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"dp_size": 0}, "dp_size"),
        ({"model_path": 7}, "model_path"),
        ({"max_total_num_tokens": "lots", "internal_states": []}, "max_total_num_tokens"),
        ({"internal_states": [{"memory_usage": {"token_capacity": -1}}]}, "internal_states[0].memory_usage.token_capacity"),
        ({"internal_states": [{"memory_usage": {}}]}, "token_capacity"),
        ({"internal_states": "x"}, "internal_states"),
        ({"hicache_write_policy": True}, "hicache_write_policy"),
        ({"hicache_write_policy": ["write_back"], "enable_hierarchical_cache": False}, "hicache_write_policy"),
    ],
)
def test_malformed_server_info_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkerProtocolError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_server_info({**SERVER_INFO, **change})


def test_server_info_with_no_capacity_at_all_is_refused() -> None:
    body = {k: v for k, v in SERVER_INFO.items() if k not in ("max_total_num_tokens", "internal_states")}
    with pytest.raises(WorkerProtocolError, match="max_total_num_tokens"):
        parse_server_info(body)
    with pytest.raises(WorkerProtocolError, match="JSON object"):
        parse_server_info([])  # type: ignore[arg-type]


def test_loads_are_summed_over_ranks() -> None:
    assert parse_loads(LOADS) == WorkerLoad(
        running=8, waiting=1, used_tokens=320_000, token_usage=0.44, cache_hit_rate=pytest.approx(0.6), ranks=2
    )


def test_loads_without_cache_hit_rates_report_none() -> None:
    body = copy.deepcopy(LOADS)
    for entry in body["loads"]:
        entry["cache_hit_rate"] = None
    assert parse_loads(body).cache_hit_rate is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"loads": []}, "loads"),
        ({"version": "0.5.23"}, "loads"),
        (
            {"loads": [_load(0, 1, 0, 10, 0.1, 0.0), {**_load(1, 1, 0, 10, 0.1, 0.0), "num_running_reqs": "2"}]},
            r"loads\[1\]\.num_running_reqs",
        ),
        ({"loads": [{**_load(0, 1, 0, 10, 0.1, 0.0), "token_usage": float("nan")}]}, r"loads\[0\]\.token_usage"),
        ({"loads": [{k: v for k, v in _load(0, 1, 0, 10, 0.1, 0.0).items() if k != "num_used_tokens"}]}, "num_used_tokens"),
    ],
)
def test_malformed_loads_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkerProtocolError, match=field):
        parse_loads(body)


def test_cached_tokens_from_every_response_shape() -> None:
    assert cached_tokens(CHAT_RESPONSE) == 1920
    assert cached_tokens(GENERATE_RESPONSE) == 1024
    split_only = copy.deepcopy(GENERATE_RESPONSE)
    del split_only["meta_info"]["cached_tokens"]
    assert cached_tokens(split_only) == 1024
    final_stream_chunk = {
        "id": "chatcmpl-8d6f",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": CHAT_RESPONSE["usage"],
    }
    assert cached_tokens(final_stream_chunk) == 1920


def test_cached_tokens_is_none_when_the_worker_does_not_report_them() -> None:
    without_report = copy.deepcopy(CHAT_RESPONSE)
    without_report["usage"]["prompt_tokens_details"] = None  # SGLang without --enable-cache-report
    assert cached_tokens(without_report) is None
    assert cached_tokens({"choices": []}) is None


def test_bad_cached_tokens_name_the_field() -> None:
    bad = copy.deepcopy(CHAT_RESPONSE)
    bad["usage"]["prompt_tokens_details"]["cached_tokens"] = -3
    with pytest.raises(WorkerProtocolError, match="prompt_tokens_details.cached_tokens"):
        cached_tokens(bad)
    bad_meta = copy.deepcopy(GENERATE_RESPONSE)
    bad_meta["meta_info"]["cached_tokens"] = True
    with pytest.raises(WorkerProtocolError, match="meta_info.cached_tokens"):
        cached_tokens(bad_meta)


def test_host_capacity_from_prometheus_text_sums_ranks() -> None:
    assert parse_host_capacity(METRICS_TEXT) == 2 * 1_839_648
    assert parse_host_capacity(METRICS_TEXT.split("# HELP sglang:hicache")[0]) is None
    with pytest.raises(WorkerProtocolError, match="hicache_host_total_tokens"):
        parse_host_capacity(f"sglang:hicache_host_total_tokens{{{LABELS}}} -5\n")


# -- the client against real servers ---------------------------------------------------------


class FixtureServer:
    """A real HTTP server on 127.0.0.1 answering with the fixtures above; ``/server_info`` can be
    switched off to exercise the deprecated alias, and every /generate body is kept."""

    def __init__(self, *, new_server_info: bool = True) -> None:
        app = FastAPI()
        self.generate_bodies: list[dict[str, Any]] = []
        if new_server_info:
            app.get("/server_info")(lambda: SERVER_INFO)
        app.get("/get_server_info")(lambda: SERVER_INFO)
        app.get("/v1/loads")(lambda: LOADS)
        app.get("/metrics")(lambda: Response(METRICS_TEXT, media_type="text/plain; version=0.0.4"))
        app.get("/health")(lambda: Response(status_code=503))

        @app.post("/generate")
        async def generate(request: Request) -> dict[str, Any]:
            self.generate_bodies.append(await request.json())
            return GENERATE_RESPONSE

        @app.post("/v1/tokenize")
        async def tokenize(request: Request) -> dict[str, Any]:
            # entrypoints/openai/serving_tokenize.py: TokenizeResponse
            self.generate_bodies.append(await request.json())
            return {"tokens": [151644, 8948, 198, 2610, 525], "count": 5, "max_model_len": 32768}

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "FixtureServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "fixture server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def test_client_reads_fixture_shapes_and_falls_back_to_the_deprecated_server_info() -> None:
    async def check(url: str) -> None:
        async with aiohttp.ClientSession() as session:
            worker = SGLangClient(url + "/", lambda: session)
            assert worker.url == url
            assert (await worker.capacity()).gpu_tokens == 919_824
            assert (await worker.load()).running == 8
            assert await worker.host_capacity() == 2 * 1_839_648
            assert await worker.healthy() is False  # this fixture answers 503
            assert await worker.warmup([1, 2, 3], priority=5) == 1024
            assert await worker.warmup("some text") == 1024
            assert await worker.kv_event_endpoints() == []
            assert await worker.tokenize([{"role": "user", "content": "hi"}]) == [151644, 8948, 198, 2610, 525]

    with FixtureServer(new_server_info=False) as server:
        asyncio.run(check(server.url))
        assert server.generate_bodies == [
            {"sampling_params": {"max_new_tokens": 0}, "input_ids": [1, 2, 3], "priority": 5},
            {"sampling_params": {"max_new_tokens": 0}, "text": "some text"},
            {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
        ]


def test_client_against_a_running_sim_worker() -> None:
    async def check(url: str) -> tuple[int | None, int | None, WorkerCapacity, WorkerLoad, int | None, bool]:
        async with aiohttp.ClientSession() as session:
            worker = SGLangClient(url, lambda: session)
            prompt = "shared context " * 200
            first = await worker.warmup(prompt)
            second = await worker.warmup(prompt)
            return (
                first,
                second,
                await worker.capacity(),
                await worker.load(),
                await worker.host_capacity(),
                await worker.healthy(),
            )

    kv_port = free_port()
    config = SimWorkerConfig(
        port=0,
        gpu_tokens=50_000,
        cpu_tokens=120_000,
        time_scale=20.0,
        hicache_write_policy="write_back",
        kv_events_config=f'{{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:{kv_port}"}}',
    )
    with SimWorkerThread(config) as w:
        first, second, capacity, load, host, healthy = asyncio.run(check(w.url))

        async def endpoints() -> list[str]:
            async with aiohttp.ClientSession() as session:
                return await SGLangClient(w.url, lambda: session).kv_event_endpoints()

        assert asyncio.run(endpoints()) == [f"tcp://127.0.0.1:{kv_port}"]
        url = w.url
    assert (first, second) == (0, 400)  # "shared context " is two tokens; the repeat is all cached
    assert capacity == WorkerCapacity(50_000, 120_000, 1, config.model_path, "write_back")
    assert (load.running, load.waiting, load.ranks) == (0, 0, 1)
    assert load.cache_hit_rate == pytest.approx(0.5)
    assert host == 120_000
    assert healthy is True

    async def after_stop() -> bool:
        async with aiohttp.ClientSession() as session:
            return await SGLangClient(url, lambda: session, health_timeout_s=0.5).healthy()

    assert asyncio.run(after_stop()) is False


# -- KV events -------------------------------------------------------------------------------
# Encoding from python/sglang/srt/disaggregation/kv_events.py (SGLang 0.5.23): multipart
# [topic, 8-byte big-endian seq, msgpack EventBatch]; EventBatch is the array [ts, events,
# attn_dp_rank]; each event a tagged map (msgspec tag=True, omit_defaults=True): "type" first,
# then every field without a default, then the optional ones that are set.

H1, H2, H3 = -8_212_101_512_310_441_000, 4_411_902_118_775_002_113, 731_442_900_118_552_311


def _stored(
    hashes: list[int], parent: int | None, tokens: int, *, medium: str = "GPU", session: str | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": list(range(100, 100 + tokens)),
        "block_size": tokens // len(hashes),
        "lora_id": None,
        "medium": medium,
    }
    if session is not None:
        event["session_id"] = session
    return event


def _removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def _batch(*events: dict[str, Any]) -> bytes:
    import msgpack

    return msgpack.packb([1764500300.25, list(events), None])


def test_kv_event_batches_decode_in_both_encodings() -> None:
    from maitred.gateway.sglang.kv_events import KVEventError, decode_batch

    batch = decode_batch(
        _batch(
            _stored([H1, H2], None, 32, session="p1"),
            _removed([H2]),
            {"type": "AllBlocksCleared"},
            {"type": "SomethingNewer", "x": 1},
        )
    )
    assert [e.kind for e in batch.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert batch.events[0].block_hashes == (H1, H2) and batch.events[0].tokens == 32
    assert batch.events[0].session_id == "p1" and batch.events[0].medium == "GPU"
    import msgpack

    positional = decode_batch(msgpack.packb([1.0, [["BlockStored", [H3], H1, [1, 2, 3], 3, None, "CPU_PINNED"]], 0]))
    assert positional.attn_dp_rank == 0
    assert positional.events[0].parent_block_hash == H1 and positional.events[0].medium == "CPU_PINNED"
    with pytest.raises(KVEventError, match="payload"):
        decode_batch(b"\xc1")
    with pytest.raises(KVEventError, match=r"events\[0\].block_hashes"):
        decode_batch(msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": "all"}], None]))


def test_residency_follows_stores_evictions_and_host_copies() -> None:
    from maitred.gateway.sglang.kv_events import ResidencyTracker, decode_batch

    tracker = ResidencyTracker()
    tracker.apply(decode_batch(_batch(_stored([H1, H2], None, 32, session="p1"))), seq=0)
    tracker.apply(decode_batch(_batch(_stored([H3], H1, 16, session="p2"))), seq=1)
    assert (tracker.session_tokens("p1"), tracker.session_tokens("p2")) == (32, 32)  # p2 shares p1's first block
    assert tracker.held_tokens() == 48 and tracker.prefix_tokens(H3) == 32
    tracker.apply(decode_batch(_batch(_stored([H2], H1, 16, medium="CPU_PINNED"), _removed([H2]))), seq=2)
    assert tracker.session_tokens("p1") == 16  # the leaf left the GPU; its parent is still there
    assert tracker.session_tokens("p1", "CPU_PINNED") == 32  # HiCache kept a host copy
    tracker.apply(decode_batch(_batch(_removed([H2], "CPU_PINNED"))), seq=5)
    assert tracker.gaps == 2 and tracker.session_tokens("p1", "CPU_PINNED") == 0
    tracker.apply(decode_batch(_batch({"type": "AllBlocksCleared"})), seq=6)
    assert tracker.held_tokens() == 0 and tracker.session_tokens("p2") == 0 and tracker.session_tokens("nobody") == 0
    tracker.apply(decode_batch(_batch(_stored([H1], None, 16, session="p3"))), seq=7)
    tracker.apply(decode_batch(_batch(_stored([H2], None, 16, session="p4"))), seq=0)  # the worker restarted
    assert tracker.restarts == 1 and tracker.session_tokens("p3") == 0 and tracker.session_tokens("p4") == 16


def test_kv_event_endpoints_come_from_server_info() -> None:
    from maitred.gateway.sglang.kv_events import endpoints_from_server_info

    info = dict(
        SERVER_INFO,
        kv_events={
            "publisher": "zmq",
            "endpoint_host": "*",
            "endpoint_port_base": 5557,
            "topic": "",
            "block_size": 16,
            "dp_size": 2,
        },
    )
    assert endpoints_from_server_info("http://gpu-0:30000", info) == ["tcp://gpu-0:5557", "tcp://gpu-0:5558"]
    assert endpoints_from_server_info("http://gpu-0:30000", SERVER_INFO) == []


def test_subscriber_tracks_a_real_zmq_publisher() -> None:
    zmq = pytest.importorskip("zmq", reason="the kv-events extra (pyzmq) is not installed")
    from maitred.gateway.sglang.kv_events import KVEventSubscriber

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    seq = 0

    def publish(payload: bytes) -> None:
        nonlocal seq
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        seq += 1

    def until(condition: Any) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, "subscriber did not catch up"
            time.sleep(0.01)

    try:
        with KVEventSubscriber(f"tcp://127.0.0.1:{port}") as sub:
            # PUB drops messages until the subscription has propagated: publish harmless batches until one lands.
            def probe() -> bool:
                publish(_batch({"type": "AllBlocksCleared"}))
                return sub.tracker.batches > 0

            until(probe)
            publish(_batch(_stored([H1, H2], None, 32, session="prog-1")))
            publish(b"not msgpack \xc1")
            publish(_batch(_stored([H3], H2, 16, session="prog-1")))
            until(lambda: sub.tracker.session_tokens("prog-1") == 48)
            publish(_batch(_removed([H3])))
            until(lambda: sub.tracker.session_tokens("prog-1") == 32)
            assert sub.malformed == 1 and sub.tracker.gaps == 1  # the unreadable batch's events are lost
    finally:
        pub.close()
