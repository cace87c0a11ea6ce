import threading
import time

import maitred
from maitred.events import ToolStart, decode_batch
from maitred.middleware import Emitter, EmitterSettings, HttpSink, PermanentSinkError
from tests.helpers import EventServer, ListSink, free_port


def event(i: int) -> ToolStart:
    return ToolStart(ts=1_800_000_000.0 + i, program_id="p", call_id=f"c{i}", tool="t")


def test_full_queue_drops_the_oldest_and_counts_them():
    gate = threading.Event()

    class Blocked(ListSink):
        def send(self, events):
            gate.wait(5)
            super().send(events)

    sink = Blocked()
    emitter = Emitter(sink, EmitterSettings(max_queue=10, batch_size=1, interval_s=0.01))
    emitter.emit(event(0))
    time.sleep(0.1)  # the worker now holds event 0 in a blocked send
    for i in range(1, 31):
        emitter.emit(event(i))
    gate.set()
    assert emitter.flush(5)
    assert emitter.dropped == 20
    assert [e.call_id for e in sink.events] == ["c0"] + [f"c{i}" for i in range(21, 31)]
    emitter.shutdown(1)


def test_flush_returns_at_its_deadline_while_the_sink_hangs():
    release = threading.Event()

    class Hanging(ListSink):
        def send(self, events):
            release.wait(30)

    emitter = Emitter(Hanging(), EmitterSettings(interval_s=0.01))
    emitter.emit(event(0))
    began = time.monotonic()
    assert emitter.flush(0.3) is False
    assert time.monotonic() - began < 2.0
    release.set()
    emitter.shutdown(1)


def test_a_refused_batch_is_dropped_not_retried_forever():
    class Refusing(ListSink):
        calls = 0

        def send(self, events):
            Refusing.calls += 1
            raise PermanentSinkError("400 bad event")

    emitter = Emitter(Refusing(), EmitterSettings(interval_s=0.01))
    for i in range(3):
        emitter.emit(event(i))
    assert emitter.flush(2)
    assert emitter.dropped == 3 and Refusing.calls == 1
    assert emitter.stats().last_error == "400 bad event"
    emitter.shutdown(1)


def test_bad_settings_are_refused():
    import pytest

    with pytest.raises(ValueError, match="max_queue"):
        EmitterSettings(max_queue=0)


def test_http_sink_posts_batches_with_bearer_token_and_retries_after_503():
    with EventServer(fail_first=2) as server:
        maitred.configure(runtime_url=server.url, token="s3cret", settings=EmitterSettings(interval_s=0.02))

        @maitred.tool
        def ping() -> str:
            return "pong"

        with maitred.program("p-http", agent="a"):
            for _ in range(5):
                assert ping() == "pong"
        deadline = time.monotonic() + 10
        while not maitred.flush(timeout=1) and time.monotonic() < deadline:
            pass
        assert server.requests >= 3
        assert set(server.auth) == {"Bearer s3cret"}
        batch = decode_batch(server.events)
        assert not batch.rejected
        assert [e.TYPE for e in batch.events].count("tool.end") == 5
        assert maitred.stats()[0].delivered == 12


def test_http_sink_to_a_closed_port_raises_for_the_emitter_to_retry():
    import httpx
    import pytest

    sink = HttpSink(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(httpx.ConnectError):
        sink.send([event(0)])
    sink.close()
