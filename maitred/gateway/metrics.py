"""Prometheus metrics of the gateway (``GET /metrics``), in a registry of their own.

One registry per gateway instance (not the process-global default), so several gateways can
live in one process — the tests run many — without clashing metric names. Names follow
Prometheus conventions (``_total`` counters, ``_seconds`` units); examples/grafana/ has a
dashboard over them.

Every label takes its values from a bounded set: tiers, phases, reasons and outcomes are fixed
sets (an answer a worker refused counts as ``worker_<its HTTP status>``), workers come from
``--worker``, endpoints from the gateway's own route table, status classes are three.
Nothing a client writes becomes a label value, with one exception kept bounded on purpose:
tool names, of which only the most called get a label of their own (``top_tools``). Program
ids, model names and paths are never labels.
"""

import collections
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from maitred.gateway.top_tools import MAX_TOOLS, TopTools
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.state import RuntimeState

Tally = collections.Counter[tuple[Tier, Phase]]


def program_counts(programs: Iterable[ProgramState]) -> Tally:
    """Programs by (tier, phase): computed on a snapshot, off the event loop."""
    return collections.Counter((p.tier, p.phase) for p in programs)


#: Request latencies from a millisecond (a held request released at once, a cached prefix and a
#: few tokens) to half an hour: a worker may take ``--request-timeout`` (600 s) to answer, and a
#: request may be held up to ``--hold-timeout`` (1,800 s) before that.
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
#: Tool durations: the calibrated workload spans 30 ms to many minutes.
TOOL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 60, 120, 300, 900)
#: What a warmup came to (``warmups``).
WARMUP_OUTCOMES = ("done", "failed", "overtaken", "skipped")
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def status_class(status: int) -> str:
    """``2xx``, ``4xx`` or ``5xx`` (and ``1xx``/``3xx``, which the gateway does not answer)."""
    return f"{min(max(status // 100, 1), 5)}xx"


class Metrics:
    """The gateway's metrics; ``max_tools``: tools given a label of their own (``top_tools``)."""

    def __init__(self, max_tools: int = MAX_TOOLS) -> None:
        self.tools = TopTools(max_tools)
        r = self.registry = CollectorRegistry()
        self.programs = Gauge(
            "maitred_programs", "Programs known to the runtime, by tier and phase", ["tier", "phase"], registry=r
        )
        self.workers_healthy = Gauge("maitred_workers_healthy", "Workers answering their health check", registry=r)
        self.tool_duration = Histogram(
            "maitred_tool_duration_seconds",
            'Durations of completed tool calls, by tool (the most called; the rest under tool="other")',
            ["tool"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self.readiness_mae = Gauge(
            "maitred_readiness_error_mae_seconds",
            "Mean absolute error of the tool-return prediction in force when each tool ended",
            registry=r,
        )
        self.readiness_within = Gauge(
            "maitred_readiness_error_within_half_second_ratio",
            "Share of tool-return predictions within 0.5 s of the observed end",
            registry=r,
        )
        self.tier_moves = Counter("maitred_tier_moves_total", "Tier moves applied, by destination tier", ["dst"], registry=r)
        self.assignments = Counter("maitred_assignments_total", "Programs placed on a worker, by reason", ["reason"], registry=r)
        self.tick = Histogram(
            "maitred_scheduler_tick_seconds",
            "Wall time of one scheduler step (snapshot, plan, apply)",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        self.scheduler_errors = Counter(
            "maitred_scheduler_errors_total", "Scheduler steps that failed (policy errors fall back to plain routing)", registry=r
        )
        self.voided = Counter(
            "maitred_plan_voided_total", "Planned assignments dropped by the re-check against live state", registry=r
        )
        self.queue_wait = Histogram(
            "maitred_queue_wait_seconds",
            "Time a request was held in the gateway before admission",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.held = Counter("maitred_held_requests_total", "Requests held for GPU room instead of being sent at once", registry=r)
        self.forced = Counter("maitred_forced_admissions_total", "Held requests let through after the bounded wait", registry=r)
        self.ttft = Histogram(
            "maitred_ttft_seconds",
            "Time from sending a request to its worker to the first byte back (the whole answer when not streamed), by endpoint",
            ["endpoint", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "maitred_request_duration_seconds",
            "Model requests from arrival to the last byte answered (time held in the gateway included), "
            "by endpoint, status class and whether the answer was streamed",
            ["endpoint", "status_class", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "maitred_requests_total", "Proxied requests, by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("maitred_prompt_tokens_total", "Prompt tokens reported by workers", registry=r)
        self.cached_tokens = Counter(
            "maitred_cached_tokens_total", "Prompt tokens the worker served from its prefix cache", registry=r
        )
        self.worker_failures = Counter(
            "maitred_worker_failures_total",
            "Times a worker was found down (a request or health check that could not reach it), by worker",
            ["worker"],
            registry=r,
        )
        self.warmups = Counter("maitred_warmups_total", "Pre-prefill warmups, by outcome", ["outcome"], registry=r)
        self.events = Counter("maitred_events_total", "Events accepted by the runtime", registry=r)
        self.dropped_events = Counter("maitred_dropped_events_total", "Events not stored, by reason", ["reason"], registry=r)
        self.store_writer_up = Gauge(
            "maitred_store_writer_up",
            "1 while events reach the session store (or will once it is back up); 0 when the writer "
            "stopped or the store can never be used, or the gateway keeps no store",
            registry=r,
        )
        self.duplicate_events = Counter(
            "maitred_duplicate_events_total", "Events received again (a re-sent batch) and counted once", registry=r
        )
        # ``shard`` is the one ``--shard`` name of this process: a bounded label.
        self.shard_role = Gauge(
            "maitred_shard_role",
            "1 for this gateway's role in its shard (holder: serves; standby: waits for the lease; "
            "lost: the held lease failed, exiting), 0 for the others; absent without --shard",
            ["shard", "role"],
            registry=r,
        )
        self.takeover = Gauge(
            "maitred_takeover_seconds",
            "The last takeover by this gateway, from the standby winning the shard's lease to serving as its "
            "holder (store opened and its programs restored, workers read, scheduler started); the lease is "
            "won at most --lease-poll after the previous holder's session ended",
            ["shard"],
            registry=r,
        )
        self.shard_messages = Counter(
            "maitred_shard_messages_total",
            "Messages between shards over PostgreSQL NOTIFY (--shard), by direction (sent; received: "
            "addressed to this shard) and kind (moved: a program's home changed)",
            ["direction", "kind"],
            registry=r,
        )
        self.moved_away = Counter(
            "maitred_programs_moved_away_total",
            "Programs this shard dropped at once because another shard now serves them",
            registry=r,
        )
        # Label values known in advance start at 0, so the first increment shows in ``rate()``
        # and a dashboard finds the series before anything happened.
        for tier in Tier:
            self.tier_moves.labels(tier.value)
        for outcome in WARMUP_OUTCOMES:
            self.warmups.labels(outcome)

    def observe_tool(self, tool: str, duration_s: float) -> None:
        """One completed tool call, under its own label or ``other`` (``top_tools``)."""
        counted = self.tools.call(tool)
        if counted.displaced is not None:
            self.tool_duration.remove(counted.displaced)
        self.tool_duration.labels(counted.label).observe(max(duration_s, 0.0))

    def observe_request(self, endpoint: str, status: int, *, stream: bool, seconds: float) -> None:
        self.request_duration.labels(endpoint, status_class(status), _yes_no(stream)).observe(seconds)

    def observe_ttft(self, endpoint: str, *, stream: bool, seconds: float) -> None:
        self.ttft.labels(endpoint, _yes_no(stream)).observe(seconds)

    def observe_state(self, state: RuntimeState, counts: Tally | None = None) -> None:
        """Refresh the gauges that describe the whole state (once per scheduler step, with the
        counts taken on its snapshot)."""
        if counts is None:
            counts = program_counts(state.programs.values())
        for tier in Tier:
            for phase in Phase:
                self.programs.labels(tier.value, phase.value).set(counts.get((tier, phase), 0))
        self.workers_healthy.set(sum(w.healthy for w in state.workers.values()))
        log = state.predictions
        if log.mae_s is not None:
            self.readiness_mae.set(log.mae_s)
            self.readiness_within.set(log.within_half_second_share or 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _yes_no(flag: bool) -> str:
    return "true" if flag else "false"
