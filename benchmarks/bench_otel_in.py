"""What OpenTelemetry in costs: ``MaitredSpanProcessor`` per span, and ``POST /v1/traces`` spans/s.

Per span: CPU time of the calling thread for ``--spans`` spans on a tracer provider with no
exporter, with the processor minus without it, for spans it ignores (a plain span) and for tool
spans it records (``execute_tool``, two events each, queued to a sink that discards batches so
the figure is the caller's cost). Medians over ``--rounds`` interleaved rounds.

Receiver: a telemetry-only gateway on 127.0.0.1 writing to a fresh SQLite file; ``--exports``
OTLP protobuf exports of ``--batch`` tool spans each, posted back to back from one client; spans/s
from the first post until every event is in the store.

    python benchmarks/bench_otel_in.py [--rounds 30] [--spans 2000] [--exports 20] [--batch 500]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.trace import TracerProvider
from reference import reference_s

import maitred
from maitred.gateway.app import ServeConfig, build_app
from maitred.harness.background import BackgroundServer
from maitred.integrations.otel import MaitredSpanProcessor
from maitred.middleware import EmitterSettings
from maitred.storage import SessionStore


class NullSink:
    def send(self, events) -> int:
        return 0

    def close(self) -> None:
        pass


def cpu_per_span_us(tracer, name: str, attributes: dict, spans: int) -> float:
    start = time.thread_time()
    for _ in range(spans):
        with tracer.start_as_current_span(name, attributes=attributes):
            pass
    return (time.thread_time() - start) / spans * 1e6


def processor_costs(rounds: int, spans: int) -> dict[str, float]:
    maitred.configure(sinks=[NullSink()], settings=EmitterSettings(max_queue=10_000_000))
    bare = TracerProvider().get_tracer("bench")
    with_processor = TracerProvider()
    with_processor.add_span_processor(MaitredSpanProcessor())
    traced = with_processor.get_tracer("bench")
    tool = {"gen_ai.conversation.id": "p-bench"}
    ignored, recorded = [], []
    for _ in range(rounds):
        plain = cpu_per_span_us(bare, "load config", {}, spans)
        ignored.append(cpu_per_span_us(traced, "load config", {}, spans) - plain)
        plain_tool = cpu_per_span_us(bare, "execute_tool pytest", tool, spans)
        recorded.append(cpu_per_span_us(traced, "execute_tool pytest", tool, spans) - plain_tool)
    maitred.shutdown(timeout=5)
    return {
        "sdk_span_cpu_us": round(plain, 2),
        "added_cpu_us_ignored_span": round(statistics.median(ignored), 2),
        "added_cpu_us_tool_span": round(statistics.median(recorded), 2),
    }


def export(index: int, batch: int, now: float) -> bytes:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for i in range(batch):
        span = spans.add()
        span.trace_id = (index * batch + i + 1).to_bytes(16, "big")
        span.span_id = (index * batch + i + 1).to_bytes(8, "big")
        span.name = "execute_tool pytest"
        span.start_time_unix_nano = int((now - 1) * 1e9)
        span.end_time_unix_nano = int(now * 1e9)
        span.attributes.append(KeyValue(key="gen_ai.conversation.id", value=AnyValue(string_value=f"p-{i % 50}")))
    return request.SerializeToString()


def receiver_rate(exports: int, batch: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        db_url = f"sqlite:///{os.path.join(folder, 'bench.db')}"
        with BackgroundServer(build_app(ServeConfig([], db_url=db_url)).app) as server:
            now = time.time()
            bodies = [export(i, batch, now) for i in range(exports)]
            started = time.perf_counter()
            with httpx.Client(timeout=60) as client:
                for body in bodies:
                    response = client.post(
                        f"{server.url}/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
                    )
                    response.raise_for_status()
                answered = time.perf_counter() - started
            expected = 2 * exports * batch
            with SessionStore(db_url) as store:
                while len(store.events()) < expected:
                    time.sleep(0.05)
            stored = time.perf_counter() - started
    spans = exports * batch
    return {"spans": spans, "answered_spans_per_s": round(spans / answered), "stored_spans_per_s": round(spans / stored)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--spans", type=int, default=2000)
    parser.add_argument("--exports", type=int, default=20)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    result = {**processor_costs(args.rounds, args.spans), **receiver_rate(args.exports, args.batch)}
    result["reference_s"] = reference_s()  # the machine's speed in the same run, to compare machines
    print(json.dumps(result))


if __name__ == "__main__":
    main()
