"""The in-process emitter under broken surroundings: a full disk that comes back, closed and
hanging ports behind the HTTP sink and the PostgreSQL store, and writers killed with SIGKILL
mid-stream. Each scenario prints one ``RELIABILITY {...}`` line (events emitted, stored,
counted dropped) for BENCHMARKS.md's "Reliability" section; ``pytest -s tests/faults`` shows them.

The processes these tests start run this file as a script (``python -m
tests.faults.test_emitter_faults <scenario> ...``), so parent and child read as one.
"""

import errno
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

import maitred
from maitred.events import Event, ToolStart
from maitred.middleware import Emitter, EmitterSettings, StoreSink
from maitred.storage import SessionStore
from tests.helpers import TcpProxy, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
#: How long a child may take before the test calls it hung: a guard, not a speed requirement.
GUARD_S = 30
#: The streaming child prints how many events it emitted every this many calls.
PRINT_EVERY = 100


def record(scenario: str, **figures: Any) -> None:
    print("RELIABILITY " + json.dumps({"scenario": scenario, **figures}))


def run_child(*args: str, timeout: float = GUARD_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.faults.test_emitter_faults", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel completes the handshake) and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        yield silent.getsockname()[1]


def target(kind: str, port: int) -> str:
    return f"http://127.0.0.1:{port}" if kind == "http" else f"postgresql+psycopg://postgres@127.0.0.1:{port}/test"


def not_delivered_at_shutdown(stderr: str) -> int:
    """What the emitter counted dropped at shutdown, from its own warning."""
    return sum(int(n) for n in re.findall(r"(\d+) not delivered at shutdown", stderr))


# -- full disk -------------------------------------------------------------------------------------


class FullDiskThenRoom(StoreSink):
    """A real store whose disk is full for the first ``full_for`` writes (``OSError(ENOSPC)``)."""

    def __init__(self, url: str, full_for: int) -> None:
        super().__init__(url)
        self.full_for = full_for

    def send(self, events: Sequence[Event]) -> int:
        if self.full_for:
            self.full_for -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().send(events)


def test_a_full_disk_is_an_outage_and_everything_buffered_is_stored_when_room_comes_back(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'full.db'}"
    emitter = Emitter(FullDiskThenRoom(url, full_for=4), EmitterSettings(interval_s=0.01, max_backoff_s=0.05))
    events = [ToolStart(ts=time.time(), program_id="p-disk", call_id=f"c{i}", tool="t") for i in range(2000)]
    with caplog.at_level(logging.WARNING, "maitred"):
        for e in events:
            emitter.emit(e)
        assert wait_until(lambda: emitter.delivered == len(events))
        assert emitter.flush(10) is True
    assert emitter.dropped == 0 and emitter.last_error is None
    assert sum("No space left on device" in r.getMessage() for r in caplog.records) == 1  # once per outage
    assert emitter.shutdown(5) is True
    with SessionStore(url) as store:
        stored = len(store.events("p-disk"))
    assert stored == len(events)
    record("full disk (ENOSPC x4, then room)", emitted=len(events), stored=stored, dropped=emitter.dropped)


# -- closed and hanging ports ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["http", "postgresql"])
def test_configure_and_exit_do_not_wait_on_a_closed_port(kind):
    """Flush timeout 60 s, but the sink refuses connections: reconfiguring and exiting each wait
    for one more attempt only, and count the events dropped."""
    port = free_port()
    result = run_child("reconfigure", kind, target(kind, port), "60", "wait-down")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["replaced"]["dropped"] == figures["emitted"] and figures["replaced"]["delivered"] == 0
    assert figures["configure_returned"] is True
    exited = run_child("exit", kind, target(kind, port), "60", "wait-down")
    assert exited.returncode == 0, exited.stderr
    emitted = json.loads(exited.stdout.splitlines()[-1])["emitted"]
    assert not_delivered_at_shutdown(exited.stderr) == emitted
    record(
        f"{kind} sink, closed port (configure, then exit)",
        emitted=figures["emitted"] + emitted,
        stored=0,
        dropped=figures["replaced"]["dropped"] + not_delivered_at_shutdown(exited.stderr),
    )


@pytest.mark.parametrize("kind", ["http", "postgresql"])
def test_configure_and_exit_wait_at_most_the_flush_timeout_on_a_hanging_port(kind):
    with silent_port() as port:
        result = run_child("reconfigure", kind, target(kind, port), "1", "no-wait")
        exited = run_child("exit", kind, target(kind, port), "1", "no-wait")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.splitlines()[-1])
    assert figures["replaced"]["dropped"] == figures["emitted"] and figures["replaced"]["delivered"] == 0
    assert figures["configure_s"] < 1 + 10  # the flush timeout, with generous room for a loaded machine
    assert exited.returncode == 0, exited.stderr
    emitted = json.loads(exited.stdout.splitlines()[-1])["emitted"]
    assert not_delivered_at_shutdown(exited.stderr) == emitted
    record(
        f"{kind} sink, hanging port (configure, then exit)",
        emitted=figures["emitted"] + emitted,
        stored=0,
        dropped=figures["replaced"]["dropped"] + not_delivered_at_shutdown(exited.stderr),
    )


@pytest.mark.timeout(120)
def test_postgresql_going_away_and_coming_back_loses_nothing(db_url, caplog):
    """A real PostgreSQL behind a proxy that goes down (connections reset, port refused) and
    comes back: everything emitted meanwhile is buffered, then stored; nothing is dropped."""
    if not db_url.startswith("postgresql"):
        pytest.skip("an outage of a database server; SQLite has none")
    parsed = make_url(db_url)
    proxy = TcpProxy(parsed.host or "127.0.0.1", parsed.port or 5432).up()
    url = parsed.set(port=proxy.port).render_as_string(hide_password=False)
    try:
        maitred.configure(db_url=url, settings=EmitterSettings(interval_s=0.05, max_backoff_s=0.2))
        with caplog.at_level(logging.WARNING, "maitred"):
            emitted = _emit("p-before", 100)
            assert maitred.flush(timeout=30) is True
            proxy.down()
            emitted += _emit("p-during", 100)
            assert wait_until(lambda: maitred.stats()[0].last_error is not None)
            assert maitred.flush(timeout=0.5) is False  # still queued, not dropped
            proxy.up()
            assert wait_until(lambda: maitred.stats()[0].queued == 0)
            assert maitred.flush(timeout=30) is True
        (stats,) = maitred.stats()
        assert (stats.delivered, stats.dropped, stats.last_error) == (emitted, 0, None)
        messages = [r.getMessage() for r in caplog.records]
        assert sum(m.startswith("maitred: StoreSink unavailable") for m in messages) == 1
        assert sum(m == "maitred: StoreSink reachable again" for m in messages) == 1
    finally:
        maitred.shutdown()
        proxy.down()
    stored = stored_tool_calls(db_url, "p-before")[0] + stored_tool_calls(db_url, "p-during")[0]
    assert stored == emitted
    record("PostgreSQL down, then back (proxy cut)", emitted=emitted, stored=stored, dropped=stats.dropped)


# -- kill -9 mid-stream ----------------------------------------------------------------------------


def stored_tool_calls(url: str, program_id: str) -> tuple[int, int]:
    """(events stored for the program, tool calls with both start and end), after an integrity check."""
    with SessionStore(url) as store:
        assert store.check_integrity() == []
        events = store.events(program_id)
        timeline = store.program(program_id)
    complete = sum(1 for s in timeline.spans if s.kind == "tool" and s.end is not None) if timeline else 0
    return len(events), complete


@pytest.mark.timeout(300)
def test_a_writer_killed_mid_stream_leaves_a_sound_store_and_later_writers_continue(fresh_db):
    url = fresh_db()
    rng = random.Random(7)
    total_emitted = total_stored = 0
    for run in range(5):
        program_id = f"killed-{run}"
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.test_emitter_faults", "stream", url, program_id, "20000", "0.0002"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert child.stdout is not None
        kill_after = rng.randrange(200, 10_000)
        emitted = 0
        for line in child.stdout:
            emitted = int(line)
            if emitted >= kill_after:
                break
        child.send_signal(signal.SIGKILL)
        child.wait(GUARD_S)
        emitted = max([emitted, *map(int, child.stdout.read().split())])  # lines still in the pipe
        stored, _ = stored_tool_calls(url, program_id)
        assert stored <= emitted + 2 * PRINT_EVERY  # never more than was emitted (it prints every 100 calls)
        total_emitted += emitted
        total_stored += stored
    finished = run_child("stream", url, "after-the-kills", "500", "0", timeout=120)
    assert finished.returncode == 0, finished.stderr
    stored, complete = stored_tool_calls(url, "after-the-kills")
    assert (stored, complete) == (1002, 500)  # a later writer continues, losing nothing
    record(
        f"kill -9 mid-stream x5 ({url.split(':')[0]}), then a writer of 1,002 events",
        emitted=total_emitted,
        stored=total_stored,
        dropped=0,
        lost_in_memory=total_emitted - total_stored,
        later_writer_stored=stored,
    )


# -- concurrent first use ------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_several_processes_writing_first_to_a_new_store_lose_nothing_quietly(fresh_db):
    """Four processes start at once on a store nobody has created yet: every event is stored,
    none is dropped, no process is left with a ``last_error``, and nothing multi-line (SQL,
    tracebacks) reaches stderr."""
    url = fresh_db()
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.faults.test_emitter_faults", "first-use", url, f"first-{i}", "500"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for i in range(4)
    ]
    outcomes = [child.communicate(timeout=240) for child in children]
    assert [child.returncode for child in children] == [0] * 4, [err for _, err in outcomes]
    stats = [json.loads(out.splitlines()[-1]) for out, _ in outcomes]
    assert [(s["dropped"], s["last_error"]) for s in stats] == [(0, None)] * 4
    for _, err in outcomes:
        assert "CREATE TABLE" not in err and "Traceback" not in err and "pg_type" not in err, err
    stored = [stored_tool_calls(url, f"first-{i}") for i in range(4)]
    assert stored == [(1002, 500)] * 4
    record(
        f"4 processes' first writes at once ({url.split(':')[0]})",
        emitted=4 * 1002,
        stored=sum(n for n, _ in stored),
        dropped=sum(s["dropped"] for s in stats),
    )


# -- the child processes ---------------------------------------------------------------------------


class Discard:
    def send(self, events: Sequence[Event]) -> int:
        return 0

    def close(self) -> None:
        pass


def _configure(kind: str, where: str, flush_timeout_s: float) -> None:
    settings = EmitterSettings(flush_timeout_s=flush_timeout_s, interval_s=0.05, max_backoff_s=0.5)
    if kind == "http":
        maitred.configure(runtime_url=where, settings=settings)
    else:
        maitred.configure(db_url=where, settings=settings)


def _emit(program_id: str, calls: int) -> int:
    tool = maitred.tool(name="work")(lambda: None)
    with maitred.program(program_id):
        for _ in range(calls):
            tool()
    return 2 * calls + 2


def _wait_down(how: str) -> None:
    if how == "wait-down":
        from maitred.middleware import config

        assert wait_until(lambda: all(e.stats().last_error for e in config._emitters), timeout=20)


def child(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    scenario = argv[0]
    if scenario == "reconfigure":
        kind, where, flush_timeout, how = argv[1:]
        _configure(kind, where, float(flush_timeout))
        emitted = _emit("p-reconfigure", 50)
        _wait_down(how)
        from maitred.middleware import config

        (replaced,) = config._emitters
        began = time.monotonic()
        maitred.configure(sinks=[Discard()])
        took = time.monotonic() - began
        stats = replaced.stats()
        print(
            json.dumps(
                {
                    "emitted": emitted,
                    "configure_returned": True,
                    "configure_s": took,
                    "replaced": {"delivered": stats.delivered, "dropped": stats.dropped},
                }
            ),
            flush=True,
        )
    elif scenario == "exit":
        kind, where, flush_timeout, how = argv[1:]
        _configure(kind, where, float(flush_timeout))
        emitted = _emit("p-exit", 50)
        _wait_down(how)
        print(json.dumps({"emitted": emitted}), flush=True)
    elif scenario == "stream":
        url, program_id, calls, pace_s = argv[1:]
        maitred.configure(db_url=url)
        tool = maitred.tool(name="work")(lambda: time.sleep(float(pace_s)))  # an agent's tool takes time
        with maitred.program(program_id):
            for i in range(1, int(calls) + 1):
                tool()
                if i % PRINT_EVERY == 0:
                    print(2 * i + 1, flush=True)  # events emitted so far, program.start included
    elif scenario == "first-use":
        url, program_id, calls = argv[1:]
        maitred.configure(db_url=url)
        emitted = _emit(program_id, int(calls))
        ok = maitred.flush(timeout=120)
        (stats,) = maitred.stats()
        print(json.dumps({"emitted": emitted, "flushed": ok, "dropped": stats.dropped, "last_error": stats.last_error}))
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    child(sys.argv[1:])
