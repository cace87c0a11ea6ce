"""A real OTLP/HTTP traces receiver on 127.0.0.1 (stdlib HTTP server, opentelemetry-proto to
decode), for the export's tests and ``benchmarks/bench_middleware.py``: it keeps every span it
is sent as a plain dict, or answers every request with ``status`` instead."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    """POST /v1/traces, decoded into plain dicts; answers ``status`` (200 unless told)."""

    def __init__(self, port: int = 0, status: int = 200) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.status = status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.requests += 1
                if receiver.status == 200:
                    request = ExportTraceServiceRequest.FromString(body)
                    receiver.spans.extend(
                        _decoded(s, rs.resource) for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
                    )
                self.send_response(receiver.status)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def named(self, name: str) -> dict[str, Any]:
        (span,) = [s for s in self.spans if s["name"] == name]
        return span


def _decoded(span: Any, resource: Any) -> dict[str, Any]:
    def value(v: Any) -> Any:
        return getattr(v, v.WhichOneof("value"))

    return {
        "name": span.name,
        "resource": {a.key: value(a.value) for a in resource.attributes},
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent": span.parent_span_id.hex(),
        "attributes": {a.key: value(a.value) for a in span.attributes},
        "events": [e.name for e in span.events],
        "links": [link.span_id.hex() for link in span.links],
    }
