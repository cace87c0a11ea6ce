"""Several processes writing to one new database at once: the schema is created once, quietly
(no CREATE TABLE or pg_type errors on anyone's stderr), and every event is stored exactly once,
including the ones all writers send."""

from sqlalchemy import func, select

from maitred.storage import SessionStore
from maitred.storage.models import EventRow, ToolCallRow
from tests.faults.store_child import batch_events, event_keys, forkserver, reported, run_writer

WRITERS, BATCHES, SIZE, SHARED = 4, 5, 200, 100


def test_concurrent_first_use_stores_every_event_once_and_quietly(fresh_db, tmp_path):
    url = fresh_db()
    context = forkserver()
    start = context.Event()
    processes = [
        context.Process(
            target=run_writer,
            args=(url, str(tmp_path / f"w{n}.txt")),
            kwargs={
                "writer": f"w{n}",
                "batches": BATCHES,
                "size": SIZE,
                "shared": SHARED,
                "start": start,
                "stderr": str(tmp_path / f"w{n}.err"),
            },
        )
        for n in range(WRITERS)
    ]
    for process in processes:
        process.start()
    start.set()  # all at once, onto a database nobody has created yet
    for process in processes:
        process.join(timeout=300)
    errors = {n: (tmp_path / f"w{n}.err").read_text() for n in range(WRITERS)}
    assert [p.exitcode for p in processes] == [0] * WRITERS, errors
    for n in range(WRITERS):
        assert errors[n] == ""
        assert len(reported(tmp_path / f"w{n}.txt")[0]) == BATCHES
    expected = set()
    for batch in range(BATCHES):
        expected |= event_keys(batch_events("shared", batch, SHARED))
        for n in range(WRITERS):
            expected |= event_keys(batch_events(f"w{n}", batch, SIZE))
    with SessionStore(url) as store, store.engine.connect() as conn:
        keys = list(conn.scalars(select(EventRow.event_key)))
        assert len(keys) == len(expected) == WRITERS * BATCHES * SIZE + BATCHES * SHARED
        assert set(keys) == expected
        assert conn.scalar(select(func.count()).select_from(ToolCallRow)) == len(expected) // 2
        assert store.tool_stats().n == len(expected) // 2
