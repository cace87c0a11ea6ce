"""``OtlpSink``: maitred's events exported as OpenTelemetry GenAI spans over OTLP/HTTP, to what
agent teams already run (Langfuse, Arize Phoenix, an OpenTelemetry collector).

The sink runs in its emitter's thread, like the store and HTTP sinks, and keeps their promises:
the emitter is the only queue (the SDK's ``BatchSpanProcessor`` is not used, so there is no
second, unbounded one, and no thread of its own to hang at exit); each batch of events becomes
spans (``maitred.middleware.otlp_spans``) handed to the SDK's ``OTLPSpanExporter`` at most
``max_spans_per_request`` at a time, each export bounded by ``timeout_s``. A receiver that is
down raises (the emitter keeps the batch, backs off, retries and counts, one warning per
outage); the retry sends the spans already made from that batch, not the events again, so no
start or end is paired twice. A receiver that refuses spans for what they hold (400, 413,
422) has their events counted as refused, as ``HttpSink`` does. The exporter's own lines about
each failed attempt are held back on the sink's thread: the emitter reports the outage.

The spans never pass through a ``TracerProvider``, so a span processor the program installs
(maitred's own OpenTelemetry-in processor included) never sees them, and the export's HTTP
requests run with instrumentation suppressed, as the SDK's processors do.

Nothing of OpenTelemetry is imported until the first batch: ``require_otel`` only looks for
the packages, so ``configure`` can refuse at once, in one line, when the extra is missing.
"""

import importlib.util
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from maitred.events import Event, LLMStart, ProgramStart, ToolStart
from maitred.middleware.sinks import Throttled, valid_events
from maitred.middleware.span_notes import MAX_NOTES, SpanNotes, span_key

if TYPE_CHECKING:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from maitred.middleware.otlp_spans import Finished, SpanPairs

log = logging.getLogger("maitred")

#: OTLP/HTTP's path for traces, appended to an endpoint given as a base URL (the
#: ``OTEL_EXPORTER_OTLP_ENDPOINT`` convention).
TRACES_PATH = "/v1/traces"
INSTALL_HINT = "pip install 'maitred[otel]'"
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
_REFUSED = (400, 413, 422)


class OtlpUnavailable(Exception):
    """The receiver did not take a batch (down, timed out, or answering an error)."""


def require_otel(what: str) -> None:
    """Raise ``ImportError`` with one line naming the extra when the SDK or exporter is missing."""
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ImportError(f"{what}: the OpenTelemetry exporter is not installed ({module}): {INSTALL_HINT}")


def traces_url(endpoint: str, what: str = "otlp_endpoint") -> str:
    """The OTLP/HTTP traces URL for ``endpoint``: a base URL (``http://host:4318``,
    Langfuse's ``.../api/public/otel``) gets ``/v1/traces`` appended, a URL already ending in it
    is used as it is. ``ValueError`` naming ``what`` for anything but an http(s) URL."""
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what}: expected an http:// or https:// URL of an OTLP/HTTP receiver, got {endpoint!r}")
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return parts._replace(path=path).geturl()


class _Quiet(logging.Filter):
    """Holds back the exporter's records made while this process's sinks export on their own
    threads (one error per failed attempt otherwise); other exporters in the program still log."""

    def __init__(self) -> None:
        super().__init__()
        self.exporting = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(self.exporting, "on", False):
            return True
        self.exporting.last = record.getMessage()  # for the sink's own message
        return False


_quiet = _Quiet()


class OtlpSink:
    """Exports events as GenAI spans to ``endpoint`` (see ``traces_url``). ``headers`` go with
    every request (Langfuse's ``Authorization``); without them, and for TLS certificates and
    compression, the exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables.
    ``service_name`` is the resource's ``service.name`` unless ``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` says otherwise (Phoenix files spans under the resource
    attribute ``openinference.project.name``, which the latter can set)."""

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        max_spans_per_request: int = 1_000,
        max_open_spans: int | None = None,
        service_name: str = "maitred",
        annotate: Callable[[Event], Mapping[str, Any]] | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive seconds, got {timeout_s!r}")
        if max_spans_per_request < 1:
            raise ValueError(f"max_spans_per_request must be at least 1, got {max_spans_per_request!r}")
        if max_open_spans is not None and max_open_spans < 1:
            raise ValueError(f"max_open_spans must be at least 1, got {max_open_spans!r}")
        self.url = traces_url(endpoint)
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.max_spans_per_request = max_spans_per_request
        self.max_open_spans = max_open_spans
        self.service_name = service_name
        self.annotate = annotate
        self._notes = SpanNotes(max_open_spans or MAX_NOTES)
        self._refusals = Throttled()
        self._annotate_failures = Throttled()
        self._reset()

    def note(self, event: Event) -> None:
        """``annotate(event)``, kept for the span ``event`` starts (called for start events
        only: an end's attributes would come after its span was made); never raises. Call it
        before the event is emitted."""
        if self.annotate is None or not isinstance(event, (ProgramStart, LLMStart, ToolStart)):
            return
        try:
            attributes = self.annotate(event)
        except Exception as exc:
            self._annotate_failures.warning("maitred: no span attributes for a %s event: %r", event.TYPE, exc)
            return
        if attributes:
            self._notes.put(span_key(event), attributes)

    def _reset(self) -> None:
        self._exporter: OTLPSpanExporter | None = None
        self._session: Any = None
        self._pairs: SpanPairs | None = None
        # The batch whose export failed, what is left of its spans, and its refusals so far:
        # the emitter retries with the same batch (the same list).
        self._retry: tuple[Sequence[Event], list[Finished], int] | None = None

    def __repr__(self) -> str:
        return f"OtlpSink({self.url!r})"

    def _build(self) -> "SpanPairs":
        """The exporter and the pairing state, on the emitter's thread at the first batch."""
        import requests
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource

        from maitred.middleware.otlp_spans import MAX_OPEN_SPANS, SpanPairs

        class Recording(requests.Session):
            """Keeps the last answer (or error) for the sink's messages: the exporter only says
            SUCCESS or FAILURE."""

            outcome: tuple[int | None, str] | None = None  # None: no request made

            def request(self, *args: Any, **kwargs: Any) -> Any:
                try:
                    response = super().request(*args, **kwargs)
                except Exception as exc:
                    self.outcome = (None, f"{type(exc).__name__}: {exc}")
                    raise
                self.outcome = (response.status_code, response.text[:300])
                return response

        logging.getLogger(_EXPORTER_LOGGER).addFilter(_quiet)  # once: a filter is added only once
        self._session = Recording()
        self._exporter = OTLPSpanExporter(
            endpoint=self.url, headers=self.headers or None, timeout=self.timeout_s, session=self._session
        )
        # OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, read by the SDK's detector itself:
        # ``Resource.create`` would run its detectors on a thread pool, which refuses work at
        # interpreter exit, where a last batch may still be sent.
        resource = OTELResourceDetector().detect()
        if not resource.attributes.get("service.name"):
            resource = resource.merge(Resource({"service.name": self.service_name}))
        self._pairs = SpanPairs(resource, max_open=self.max_open_spans or MAX_OPEN_SPANS, notes=self._notes)
        return self._pairs

    def send(self, events: Sequence[Event]) -> int:
        pairs = self._pairs or self._build()
        if self._retry is not None and self._retry[0] is events:
            _, finished, refused = self._retry
        else:
            valid = valid_events(events, self._refusals)
            finished, refused = pairs.feed(valid), len(events) - len(valid)
        self._retry = None
        step = self.max_spans_per_request
        for start in range(0, len(finished), step):
            try:
                refused += self._export(finished[start : start + step])
            except OtlpUnavailable:
                self._retry = (events, finished[start:], refused)
                raise
        # a span holds events of earlier batches too (its start): this batch's count is the most
        return min(refused, len(events))

    def _export(self, finished: "Sequence[Finished]") -> int:
        """Export one request's spans; returns the events refused with them, raises when not taken."""
        from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
        from opentelemetry.sdk.trace.export import SpanExportResult

        assert self._exporter is not None
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        self._session.outcome, _quiet.exporting.last = None, "no reason given"
        _quiet.exporting.on = True
        try:
            result = self._exporter.export([f.span for f in finished])
        finally:
            _quiet.exporting.on = False
            detach(token)
        if result is SpanExportResult.SUCCESS:
            return 0
        count = sum(f.events for f in finished)
        if self._session.outcome is None:  # never sent: it could not be encoded, or is over the size limit
            self._refusals.warning("maitred: %d spans (%d events) not exported: %s", len(finished), count, _quiet.exporting.last)
            return count
        status, detail = self._session.outcome
        if status in _REFUSED:
            self._refusals.warning(
                "maitred: %s refused %d spans (%d events): %s %s", self.url, len(finished), count, status, detail
            )
            return count
        raise OtlpUnavailable(f"{self.url}: {detail if status is None else f'{status} {detail}'}")

    def close(self) -> None:
        """Spans still open are ended now, marked incomplete, and exported with whatever a
        failed batch left (one attempt, ``timeout_s`` at most); what cannot go is logged."""
        if self._pairs is None or self._exporter is None:
            return
        left = (self._retry[1] if self._retry is not None else []) + self._pairs.close()
        step = self.max_spans_per_request
        try:
            while left:
                self._export(left[:step])
                left = left[step:]
        except OtlpUnavailable as exc:
            log.warning("maitred: %d spans not exported at close (%s)", len(left), exc)
        finally:
            self._exporter.shutdown()
            self._reset()

    def after_fork(self) -> None:
        """A forked child neither shares the parent's connections nor exports the parent's open
        spans (the parent ends them): it starts over at its next batch. The session is dropped,
        not closed, for the reason ``HttpSink.after_fork`` gives."""
        self._reset()
