"""kill -9 at every point of a process's first write to a new database (or to one a migration
behind), and at random points of later batches: every later open works, the schema is whole,
and every batch the store reported stored is there."""

import random
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from maitred.storage import SessionStore
from maitred.storage.engine import make_engine
from maitred.storage.migrate import FIRST_REVISION, current_revision, head_revision, upgrade
from maitred.storage.models import EventRow
from tests.faults.store_child import batch_events, event_keys, forkserver, reported, run_writer

BATCHES, SIZE = 2, 40


def _run(url: str, report: Path, *, kill_at: int = 0, batches: int = BATCHES) -> int | None:
    process = forkserver().Process(
        target=run_writer, args=(url, str(report)), kwargs={"writer": "w", "batches": batches, "size": SIZE, "kill_at": kill_at}
    )
    process.start()
    process.join(timeout=120)
    return process.exitcode


def _at_first_revision(url: str) -> str:
    """A database as the first release left it: schema at revision 0001, one batch stored."""
    engine = make_engine(url)
    upgrade(engine, FIRST_REVISION)
    engine.dispose()
    with SessionStore(url, migrate=False) as store:
        store.write(batch_events("old", 0, SIZE))
    return url


def _check_after(url: str, report: Path, *, old: bool) -> int:
    """Open the database again: it must open, be whole, hold every reported batch (and what
    was there before) and take more writes. Returns how many batches had been reported."""
    stored, _ = reported(report)
    expected = set().union(*(event_keys(batch_events(w, b, SIZE)) for w, b in stored + [("old", 0)] * old))
    with SessionStore(url) as store:
        assert current_revision(store.engine) == head_revision()
        assert store.check_integrity() == []
        with store.engine.connect() as conn:
            keys = set(conn.scalars(select(EventRow.event_key)))
        assert expected <= keys
        again = store.write(batch_events("w", 0, SIZE))
        assert (again.stored, again.rejected) == (SIZE, [])
    return len(stored)


@pytest.mark.parametrize("old", [False, True], ids=["new-database", "one-migration-behind"])
def test_a_kill_at_any_point_of_the_first_write_leaves_a_database_that_opens(fresh_db, tmp_path, old):
    def database() -> str:
        return _at_first_revision(fresh_db()) if old else fresh_db()

    first = database()
    assert _run(first, tmp_path / "clean.txt") == 0
    stored, points = reported(tmp_path / "clean.txt")
    assert len(stored) == BATCHES and points
    # Every point on SQLite; every third on PostgreSQL, whose round trips make each run slower.
    stride = 3 if first.startswith("postgresql") else 1
    outcomes = []
    for kill_at in range(1, points + 1, stride):
        report = tmp_path / f"kill-{kill_at}.txt"
        url = database()
        assert _run(url, report, kill_at=kill_at) == -signal.SIGKILL
        outcomes.append(_check_after(url, report, old=old))
    # The kills spanned the migration (nothing reported yet) through the last batch.
    assert outcomes[0] == 0 and outcomes[-1] == BATCHES - 1


def test_a_kill_at_a_random_moment_mid_batch_loses_nothing_reported(fresh_db, tmp_path):
    rng = random.Random(7)
    url = fresh_db()
    for run in range(6):
        report = tmp_path / f"run-{run}.txt"
        process = forkserver().Process(
            target=run_writer, args=(url, str(report)), kwargs={"writer": f"w{run}", "batches": 10**6, "size": 400}
        )
        process.start()
        deadline = time.monotonic() + 120
        while len(reported(report)[0]) < 2 and time.monotonic() < deadline and process.is_alive():
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))  # lands the kill anywhere in the next batches
        process.kill()
        process.join()
        assert process.exitcode == -signal.SIGKILL
        stored, _ = reported(report)
        assert len(stored) >= 2
        expected = set().union(*(event_keys(batch_events(w, b, 400)) for w, b in stored))
        with SessionStore(url) as store, store.engine.connect() as conn:
            assert expected <= set(conn.scalars(select(EventRow.event_key)))
            assert store.check_integrity() == []
