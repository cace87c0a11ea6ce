"""The simulated SGLang worker's app (see ``maitred.sim.worker.server``) and its information endpoints.

Shapes follow SGLang 0.5.23: ``entrypoints/http_server.py`` (``/health``, ``/server_info``,
``/model_info``, ``/v1/models``), ``entrypoints/v1_loads.py`` with ``managers/load_snapshot.py``
(``/v1/loads``) and ``observability/metrics_collector.py`` (``/metrics``). The generation
endpoints are in ``maitred.sim.worker.generation`` (OpenAI chat and completions, ``/generate``),
``maitred.sim.worker.anthropic`` (``/v1/messages``) and ``maitred.sim.worker.responses``
(``/v1/responses``).
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from maitred.sim.worker import anthropic, generation, responses
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.metrics import loads_entry, metrics_text
from maitred.sim.worker.state import CONTEXT_LENGTH, SimWorker

SGLANG_VERSION = "0.5.23"
NOTE = "maitred sim-worker: a simulated SGLang server for tests and demos; it is not a model and its text is filler."


def create_app(config: SimWorkerConfig) -> FastAPI:
    """The ASGI app of one simulated worker (its engine starts with the app's lifespan)."""
    sim = SimWorker(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sim.engine.start()
        try:
            yield
        finally:
            await sim.engine.stop()
            if sim.publisher is not None:
                sim.publisher.close()

    app = FastAPI(title="maitred sim-worker (simulated SGLang server)", description=NOTE, lifespan=lifespan)
    app.state.sim = sim
    for paths, handler in (
        (("/health", "/health_generate"), health),
        (("/server_info", "/get_server_info"), server_info),
        (("/model_info", "/get_model_info"), model_info),
        (("/v1/models",), models),
        (("/v1/loads",), loads),
        (("/metrics",), metrics),
    ):
        for path in paths:
            app.add_api_route(path, handler, methods=["GET"])
    app.add_api_route("/generate", generation.generate, methods=["POST", "PUT"])
    app.add_api_route("/v1/completions", generation.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", generation.chat, methods=["POST"])
    app.add_api_route("/v1/messages", anthropic.messages, methods=["POST"])
    app.add_api_route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"])
    app.add_api_route("/v1/responses", responses.responses, methods=["POST"])
    for path in ("/v1/tokenize", "/tokenize"):
        app.add_api_route(path, generation.tokenize_request, methods=["POST"])
    return app


def _sim(request: Request) -> SimWorker:
    sim: SimWorker = request.app.state.sim
    return sim


async def health(request: Request) -> Response:
    """200, or 503 once the engine model has failed (SGLang answers 503 when it is unhealthy)."""
    return Response(status_code=200 if _sim(request).engine.failure is None else 503)


async def server_info(request: Request) -> Response:
    return generation.json_response(server_info_body(_sim(request)))


async def model_info(request: Request) -> Response:
    c = _sim(request).config
    return generation.json_response(
        {
            "model_path": c.model_path,
            "served_model_name": c.served_model_name,
            "tokenizer_path": c.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "dummy",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "maitred_sim",
            "architectures": ["MaitredSimWorker"],
            "simulated": True,
            "note": NOTE,
        }
    )


async def models(request: Request) -> Response:
    sim = _sim(request)
    name = sim.config.served_model_name
    return generation.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(sim.started),
                    "owned_by": "sglang",
                    "root": name,
                    "parent": None,
                    "max_model_len": CONTEXT_LENGTH,
                }
            ],
        }
    )


async def loads(request: Request, include: str | None = None, dp_rank: int | None = None) -> Response:
    sections = {s.strip() for s in include.split(",")} if include else None
    try:
        entry = loads_entry(_sim(request), sections)
    except ValueError as exc:
        return generation.openai_error(generation.BadRequest(str(exc), "include"))
    return generation.json_response(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": "simulated",
            "num_accelerators": 1,
            "loads": [entry] if dp_rank in (None, 0) else [],
        }
    )


async def metrics(request: Request) -> Response:
    return Response(metrics_text(_sim(request)), media_type="text/plain; version=0.0.4; charset=utf-8")


def server_info_body(sim: SimWorker) -> dict[str, Any]:
    """``/server_info``: the resolved server arguments SGLang reports, the scheduler's start-up
    info and one ``internal_states`` entry per data-parallel rank (here one)."""
    c = sim.config
    gpu, cpu = sim.gpu_tokens, sim.cpu_tokens
    kv_gb = round(gpu * sim.profile.kv_bytes_per_token / 1e9, 3)
    return {
        "model_path": c.model_path,
        "tokenizer_path": c.model_path,
        "served_model_name": c.served_model_name,
        "host": c.host,
        "port": c.port,
        "dp_size": 1,
        "tp_size": 1,
        "pp_size": 1,
        "page_size": 1,
        "context_length": CONTEXT_LENGTH,
        "max_running_requests": sim.profile.max_running,
        "chunked_prefill_size": sim.profile.prefill_chunk_tokens,
        "enable_metrics": True,
        "enable_cache_report": True,
        "enable_hierarchical_cache": cpu > 0,
        "hicache_ratio": (cpu / gpu) if cpu else None,
        "hicache_size": 0,
        "hicache_write_policy": c.hicache_write_policy,
        "radix_eviction_policy": c.radix_eviction_policy,
        "enable_priority_scheduling": False,
        "kv_events_config": c.kv_events_config,
        "launch_command": f"maitred sim-worker --port {c.port} --gpu-tokens {gpu} --cpu-tokens {cpu} --time-scale {c.time_scale} "
        f"--hicache-write-policy {c.hicache_write_policy}",
        "status": "ready",
        "max_total_num_tokens": gpu,
        "max_req_input_len": sim.max_input,
        "startup_time": sim.started,
        "kv_events": sim.kv_events.descriptor() if sim.kv_events else None,
        "internal_states": [
            {
                "world_size": 1,
                "startup_time": sim.started,
                "effective_max_running_requests_per_dp": sim.profile.max_running,
                "last_gen_throughput": 0.0,
                "memory_usage": {
                    "weight": 15.2,
                    "kvcache": kv_gb,
                    "startup_available": round(kv_gb + 15.2, 3),
                    "token_capacity": gpu,
                    "token_capacity_swa": None,
                    "graph": {},
                },
            }
        ],
        "version": SGLANG_VERSION,
        "frontend": "python",
        "maitred_sim_worker": {
            "time_scale": c.time_scale,
            "host_tokens": cpu,
            "profile": sim.profile.name,
            "script_tools": c.script_tools,
            "script": sorted(c.script.turns) if c.script is not None else None,
            "note": NOTE,
        },
    }
