import json
import logging
import re
import threading
import time

import pytest

import maitred
from maitred.events import ToolStart, decode_batch
from maitred.middleware import Emitter, EmitterSettings, HttpSink, PermanentSinkError
from maitred.storage import SessionStore
from tests.helpers import EventServer, GatedSink, ListSink, free_port, wait_until

T0 = time.time() - 3600


def event(i: int) -> ToolStart:
    return ToolStart(ts=T0 + i, program_id="p", call_id=f"c{i}", tool="t")


def dropped_in_warnings(caplog: pytest.LogCaptureFixture) -> int:
    """The drop counts the warnings reported, summed."""
    return sum(int(m.group(1)) for r in caplog.records if (m := re.search(r"dropped (\d+) events \(", r.getMessage())))


def test_full_queue_drops_the_oldest_counts_warns_once_and_flush_says_so(caplog):
    sink = GatedSink()
    emitter = Emitter(sink, EmitterSettings(max_queue=10, batch_size=1, interval_s=0.01, warn_interval_s=60))
    emitter.emit(event(0))
    assert sink.entered.wait(5)  # the worker now holds event 0 in a blocked send
    with caplog.at_level(logging.WARNING, "maitred"):
        for i in range(1, 31):
            emitter.emit(event(i))
        immediate = len(caplog.records)
        sink.gate.set()
        assert emitter.flush(5) is False  # everything queued went, but 20 were dropped
    assert immediate == 1  # the first drop is reported at once, the rest held back by the rate limit
    assert dropped_in_warnings(caplog) == 20 and "queue full at 10 events" in caplog.text
    assert emitter.dropped == 20
    assert [e.call_id for e in sink.events] == ["c0"] + [f"c{i}" for i in range(21, 31)]
    emitter.emit(event(31))
    assert emitter.flush(5) is True  # nothing dropped since the previous flush
    emitter.shutdown(1)


def test_flush_returns_at_its_deadline_while_the_sink_hangs():
    sink = GatedSink()
    emitter = Emitter(sink, EmitterSettings(interval_s=0.01))
    emitter.emit(event(0))
    assert sink.entered.wait(5)
    assert emitter.flush(0.3) is False
    assert emitter.stats().queued == 1 and emitter.dropped == 0
    sink.gate.set()
    assert emitter.flush(5) is True
    emitter.shutdown(1)


def test_flush_waits_for_what_was_emitted_before_it_not_for_a_producer_that_never_stops():
    sink = ListSink()
    emitter = Emitter(sink, EmitterSettings(interval_s=0.01, batch_size=10))
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            emitter.emit(event(i))
            i += 1

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert wait_until(lambda: len(sink.events) > 100)
        assert emitter.flush(10) is True
    finally:
        stop.set()
        producer.join()
    emitter.shutdown(5)


def test_a_refused_batch_is_dropped_not_retried_forever():
    class Refusing(ListSink):
        calls = 0

        def send(self, events):
            Refusing.calls += 1
            raise PermanentSinkError("400 bad event")

    emitter = Emitter(Refusing(), EmitterSettings(interval_s=0.01))
    for i in range(3):
        emitter.emit(event(i))
    assert emitter.flush(2) is False
    assert emitter.dropped == 3 and Refusing.calls == 1
    assert emitter.stats().last_error == "400 bad event"
    emitter.shutdown(1)


def test_an_outage_is_retried_reported_once_and_last_error_clears_on_recovery(caplog):
    class Flaky(ListSink):
        failures = 3

        def send(self, events):
            if Flaky.failures:
                Flaky.failures -= 1
                raise ConnectionError("store restarting")
            return super().send(events)

    sink = Flaky()
    emitter = Emitter(sink, EmitterSettings(interval_s=0.01, max_backoff_s=0.05))
    with caplog.at_level(logging.WARNING, "maitred"):
        for i in range(5):
            emitter.emit(event(i))
        assert wait_until(lambda: len(sink.events) == 5)
        assert emitter.flush(5) is True
    assert emitter.stats().last_error is None and emitter.dropped == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unavailable" in m for m in messages) == 1 and sum("reachable again" in m for m in messages) == 1
    emitter.shutdown(1)


def test_overflow_block_makes_the_caller_wait_for_room_and_keeps_every_event():
    sink = GatedSink()
    emitter = Emitter(sink, EmitterSettings(max_queue=10, batch_size=1, interval_s=0.01, overflow="block"))
    emitter.emit(event(0))
    assert sink.entered.wait(5)
    done = threading.Event()

    def produce() -> None:
        for i in range(1, 31):
            emitter.emit(event(i))
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    assert wait_until(lambda: emitter.stats().queued >= 11)  # 10 queued and event 0 in flight
    assert not done.is_set()  # the producer is blocked on the full queue, nothing was dropped
    sink.gate.set()
    producer.join(10)
    assert done.is_set()
    assert emitter.flush(5) is True
    assert [e.call_id for e in sink.events] == [f"c{i}" for i in range(31)] and emitter.dropped == 0
    emitter.shutdown(1)


def test_overflow_block_waits_at_most_block_timeout_once_while_the_sink_is_down(caplog):
    class Down(ListSink):
        def send(self, events):
            raise ConnectionError("connection refused")

    settings = EmitterSettings(max_queue=10, interval_s=0.01, max_backoff_s=0.05, overflow="block", block_timeout_s=0.2)
    emitter = Emitter(Down(), settings)
    with caplog.at_level(logging.WARNING, "maitred"):
        for i in range(40):
            emitter.emit(event(i))  # one wait of 0.2 s, then drops without blocking
    assert sum("dropping instead of blocking" in r.getMessage() for r in caplog.records) == 1
    assert emitter.dropped == 40 - emitter.stats().queued
    assert emitter.shutdown(0.5) is False
    assert emitter.dropped == 40


def test_configure_overflow_block_reaches_the_emitters():
    sink = ListSink()
    maitred.configure(sinks=[sink], overflow="block")
    from maitred.middleware import config

    assert [e.settings.overflow for e in config._emitters] == ["block"]


def test_bad_settings_are_refused_naming_the_setting():
    with pytest.raises(ValueError, match="max_queue must be at least 1"):
        EmitterSettings(max_queue=0)
    with pytest.raises(ValueError, match="overflow must be 'drop' or 'block'"):
        EmitterSettings(overflow="wait")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_timeout_s must be positive"):
        EmitterSettings(block_timeout_s=0)


def test_a_tight_loop_of_100000_tool_calls_into_sqlite_loses_nothing_with_default_settings(tmp_path):
    url = f"sqlite:///{tmp_path / 'loop.db'}"
    maitred.configure(db_url=url)

    @maitred.tool
    def noop(i: int) -> int:
        return i

    for i in range(100_000):
        noop(i)
    assert maitred.flush(timeout=240) is True
    (stats,) = maitred.stats()
    assert (stats.delivered, stats.dropped, stats.queued) == (200_000, 0, 0)
    maitred.shutdown()
    with SessionStore(url) as store:
        assert store.tool_stats("noop").n == 100_000


def test_http_sink_posts_batches_with_bearer_token_and_retries_after_503():
    with EventServer(fail_first=2) as server:
        maitred.configure(runtime_url=server.url, token="s3cret", settings=EmitterSettings(interval_s=0.02))

        @maitred.tool
        def ping() -> str:
            return "pong"

        with maitred.program("p-http", agent="a"):
            for _ in range(5):
                assert ping() == "pong"
        assert wait_until(lambda: maitred.stats()[0].delivered == 12)
        assert maitred.flush(timeout=5)
        assert server.requests >= 3
        assert set(server.auth) == {"Bearer s3cret"}
        batch = decode_batch(server.events)
        assert not batch.rejected
        assert [e.TYPE for e in batch.events].count("tool.end") == 5
        assert maitred.stats()[0].last_error is None


def test_http_sink_splits_a_deep_queue_into_bounded_requests():
    with EventServer() as server:
        sink = HttpSink(server.url, max_events_per_request=100)
        assert sink.send([event(i) for i in range(250)]) == 0
        sink.close()
    assert [len(body) for body in server.bodies] == [100, 100, 50]


def test_http_sink_sends_one_request_per_program_each_with_its_program_header():
    events = [ToolStart(ts=T0 + i, program_id=f"p{i % 3}", call_id=f"c{i}", tool="t") for i in range(9)]
    events.append(ToolStart(ts=T0, program_id="p\u00e9", call_id="c-e", tool="t"))
    with EventServer() as server:
        sink = HttpSink(server.url, max_events_per_request=2)
        assert sink.send(events) == 0
        sink.close()
    sent = [(h.get("x-program-id"), [e["call_id"] for e in body]) for h, body in zip(server.headers, server.bodies)]
    assert sent == [
        ("p0", ["c0", "c3"]), ("p0", ["c6"]), ("p1", ["c1", "c4"]), ("p1", ["c7"]),
        ("p2", ["c2", "c5"]), ("p2", ["c8"]), (None, ["c-e"]),
    ]  # fmt: skip


def test_http_sink_to_a_closed_port_raises_for_the_emitter_to_retry():
    import httpx

    sink = HttpSink(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(httpx.ConnectError):
        sink.send([event(0)])
    sink.close()


def test_http_sink_counts_a_request_the_runtime_refuses_and_still_sends_the_rest():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    accepted: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            refused = any(e["call_id"] == "c3" for e in body)
            if not refused:
                accepted.extend(body)
            self.send_response(400 if refused else 200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "no valid event in the batch"}}' if refused else b'{"accepted": 1}')

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        sink = HttpSink(f"http://127.0.0.1:{httpd.server_address[1]}", max_events_per_request=2)
        assert sink.send([event(i) for i in range(6)]) == 2  # the request holding c2 and c3
        sink.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [e["call_id"] for e in accepted] == ["c0", "c1", "c4", "c5"]
