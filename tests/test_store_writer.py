"""The gateway's store writer (maitred/gateway/store_writer.py) on a real SQLite store."""

import asyncio
import logging
from pathlib import Path

import pytest

from maitred.events import ToolStart
from maitred.gateway.store_writer import StoreWriter
from maitred.storage import SessionStore, StoreUnavailable
from tests.helpers import wait_until


def test_a_silent_server_while_seeding_is_one_warning_and_events_are_still_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reading the tool statistics at start-up fails with StoreUnavailable (a PostgreSQL
    server that stopped answering): one warning line without a traceback, and the writer
    goes on storing events."""
    url = f"sqlite:///{tmp_path / 'm.db'}"

    def seed(store: SessionStore) -> None:
        raise StoreUnavailable("database unavailable: postgresql://db:5432/m (no answer within 30 s)")

    caplog.set_level(logging.WARNING, logger="maitred")
    writer = StoreWriter(lambda: SessionStore(url), on_open=seed, interval_s=0.01)
    try:
        writer.submit([ToolStart(ts=1.0, program_id="p", call_id="c", tool="Bash")])
        assert wait_until(lambda: writer.stored == 1, timeout=10)
    finally:
        writer.close()
    seeding = [r for r in caplog.records if "tool statistics" in r.getMessage()]
    assert len(seeding) == 1 and seeding[0].levelno == logging.WARNING and seeding[0].exc_info is None
    assert "no answer within 30 s" in seeding[0].getMessage()
    assert [e["program_id"] for e in SessionStore(url).events("p")] == ["p"]


def test_waiting_for_a_mark_wakes_once_its_events_are_written(tmp_path: Path) -> None:
    """What a holder under ``--shard`` waits on before answering: ``when_written`` does not wait
    for the writer's idle wait (an hour here) and resolves once the events are readable; a mark
    already written resolves at once; a waiter that gave up (a timeout) does not stop the thread."""
    url = f"sqlite:///{tmp_path / 'm.db'}"
    writer = StoreWriter(lambda: SessionStore(url), interval_s=3600)

    async def scenario() -> None:
        writer.submit([ToolStart(ts=1.0, program_id="p", call_id=f"c{i}", tool="Bash") for i in range(3)])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(writer.when_written(writer.mark() + 1), 0.05)  # never queued: gives up
        assert await asyncio.wait_for(writer.when_written(writer.mark()), 30) is True
        assert len(SessionStore(url).events("p")) == 3
        writer.submit([ToolStart(ts=2.0, program_id="p", call_id="c3", tool="Bash")])
        assert await asyncio.wait_for(writer.when_written(writer.mark()), 30) is True
        assert len(SessionStore(url).events("p")) == 4
        done = writer.when_written(writer.mark())
        assert done.done() and done.result() is True

    try:
        assert writer.first_attempt.wait(10)
        asyncio.run(scenario())
    finally:
        writer.close()


def test_waiting_for_a_mark_ends_false_when_nothing_more_will_be_written(tmp_path: Path) -> None:
    """The store never opens and the writer closes: the waiter is told False at once rather
    than left to its timeout, and a later wait is False without waiting."""

    def unavailable() -> SessionStore:
        raise StoreUnavailable("database unavailable: postgresql://db:5432/m")

    writer = StoreWriter(unavailable, interval_s=3600)

    async def scenario() -> None:
        writer.submit([ToolStart(ts=1.0, program_id="p", call_id="c", tool="Bash")])
        waiting = writer.when_written(writer.mark())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await asyncio.get_running_loop().run_in_executor(None, writer.close, 0.1)
        assert await asyncio.wait_for(waiting, 10) is False
        assert (await asyncio.wait_for(writer.when_written(writer.mark()), 10)) is False

    assert writer.first_attempt.wait(10)
    asyncio.run(scenario())
    assert writer.lost() == 1


def test_events_dropped_on_submit_are_counted_lost_and_never_waited_for(tmp_path: Path) -> None:
    writer = StoreWriter(lambda: SessionStore(f"sqlite:///{tmp_path / 'm.db'}"), capacity=1, interval_s=3600)
    try:
        assert writer.first_attempt.wait(10)
        writer.submit([ToolStart(ts=1.0, program_id="p", call_id=f"c{i}", tool="Bash") for i in range(3)])
        assert writer.lost() == 2 and not writer.stopped
    finally:
        writer.close()
    writer.submit([ToolStart(ts=1.0, program_id="p", call_id="late", tool="Bash")])
    assert writer.lost() == 3 and writer.stopped
