"""The simulated worker's load report (``/v1/loads``) and Prometheus metrics (``/metrics``).

Both read the engine model at request time, in SGLang's terms: ``num_used_tokens`` is KV held
by running requests (SGLang counts capacity − available − evictable, so idle cached prefixes
are not "used"); ``cache_hit_rate`` is cached over prompt tokens since start; the host pool
is reported as ``sglang:hicache_host_total_tokens`` / ``_used_tokens`` only when it exists,
as SGLang registers those gauges only with HiCache on. Metric names and labels are SGLang's
(``observability/metrics_collector.py``); only names whose meaning the double can honour are
exported.
"""

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from maitred.sim.worker.state import SimWorker

SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def _locked_tokens(sim: SimWorker) -> int:
    worker = sim.engine.worker
    running = {r.program_id for r in worker.running}
    agents = {r.agent for r in worker.running}
    return sum(worker.segments[p].gpu for p in running if p in worker.segments) + sum(
        worker.prefixes[a].tokens for a in agents if a in worker.prefixes
    )


def _hit_rate(sim: SimWorker) -> float:
    c = sim.engine.counters
    return (c.cached_device + c.cached_host) / c.prompt_tokens if c.prompt_tokens else 0.0


def loads_entry(sim: SimWorker, include: set[str] | None) -> dict[str, Any]:
    """One ``LoadSnapshot.to_dict()`` (rank 0); ``include`` as SGLang's query parameter."""
    if include is not None and not include <= SECTIONS:
        raise ValueError(f"include: invalid sections {sorted(include - SECTIONS)}; valid options: {sorted(SECTIONS)}")
    worker = sim.engine.worker
    used = _locked_tokens(sim)
    waiting_tokens = sum(r.context for r in worker.queue)
    uptime = max(time.time() - sim.started, 1e-9)
    load: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": len(worker.running),
        "num_waiting_reqs": len(worker.queue),
        "num_waiting_uncached_tokens": waiting_tokens,
        "num_used_tokens": used,
        "num_total_tokens": used + waiting_tokens,
        "num_active_tokens": used + waiting_tokens,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": sim.gpu_tokens,
        "max_running_requests": sim.profile.max_running,
        "token_usage": round(used / sim.gpu_tokens, 2),
        "gen_throughput": sim.engine.counters.generation_tokens / uptime,
        "cache_hit_rate": _hit_rate(sim),
        "utilization": 1.0 if worker.running else 0.0,
        "total_prefill_uncached_tokens": worker.stats.recomputed_tokens,
        "total_prefill_busy_us": 0,
        "decode_moments": None,
    }
    if include == {"core"}:
        return load
    everything = include is None or "all" in include
    if everything or "memory" in include:  # type: ignore[operator]
        kv_gb = round(sim.gpu_tokens * sim.profile.kv_bytes_per_token / 1e9, 3)
        load["memory"] = {"weight_gb": 15.2, "kv_cache_gb": kv_gb, "graph_gb": 0.0, "token_capacity": sim.gpu_tokens}
    if everything or "queues" in include:  # type: ignore[operator]
        load["queues"] = {"waiting": len(worker.queue), "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}
    return load


class _SimCollector(Collector):
    def __init__(self, sim: SimWorker) -> None:
        self.sim = sim

    def collect(self) -> Iterator[Metric]:
        sim = self.sim
        worker = sim.engine.worker
        counters = sim.engine.counters
        names = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        values = [sim.config.served_model_name, "unified", "0", "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        used = _locked_tokens(sim)
        yield gauge("sglang:num_running_reqs", "The number of running requests.", len(worker.running))
        yield gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", len(worker.queue))
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield gauge("sglang:token_usage", "The token usage.", round(used / sim.gpu_tokens, 2))
        yield gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", _hit_rate(sim))
        yield gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sim.gpu_tokens)
        if sim.cpu_tokens:
            yield gauge(
                "sglang:hicache_host_used_tokens", "Number of tokens currently used in the host KV cache.", worker.host_used
            )
            yield gauge("sglang:hicache_host_total_tokens", "Total capacity of the host KV cache in tokens.", sim.cpu_tokens)
        yield counter("sglang:prompt_tokens", "Number of prefill tokens processed.", counters.prompt_tokens)
        yield counter("sglang:generation_tokens", "Number of generation tokens processed.", counters.generation_tokens)
        yield counter("sglang:num_requests", "Number of requests processed.", counters.requests)
        yield counter("sglang:num_aborted_requests", "Number of requests aborted.", counters.aborted)
        cached = CounterMetricFamily(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            labels=[*names, "cache_source"],
        )
        cached.add_metric([*values, "device"], counters.cached_device)
        cached.add_metric([*values, "host"], counters.cached_host)
        yield cached


def metrics_text(sim: SimWorker) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(sim))
    return generate_latest(registry)
