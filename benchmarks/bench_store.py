"""Events/s ingested by ``SessionStore.write``: batched on SQLite and PostgreSQL, against the
same store fed one event per transaction (row at a time) in the same run, and the same batches
with one event per batch that the database refuses (the store splits each such batch to
isolate it: ``*_with_refusals`` figures, ``refused_stored`` / ``refused_rejected`` counts).

    python benchmarks/bench_store.py [--events 100000] [--batch 1000] [--postgres URL] [--reliability]

``--reliability`` adds the fault scenarios of ``tests/faults`` as figures (events written, stored
as reported by the store, found afterwards, lost, rejected) per backend: kill -9 at every point
of a first write and at random moments mid-batch, writers starting together on a new database,
and a database that runs out of room.

PostgreSQL comes from ``--postgres`` or ``MAITRED_TEST_POSTGRES_URL``; it is skipped (null in
the figures) when neither is set. Each database gets a fresh schema, dropped afterwards.
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, select

from maitred.events import Event, LLMEnd, ToolEnd, ToolStart
from maitred.storage import SessionStore, StoreUnavailable
from maitred.storage.models import EventRow

# The repository root, for the test suite's helpers (the fault scenarios' child process and the
# throwaway PostgreSQL schemas): one copy of each, run from ``benchmarks/``.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import reference_s

from tests.helpers import throwaway_schemas

T0 = time.time() - 86_400


def workload(n: int) -> list[Event]:
    """Tool start/end pairs spread over 100 programs and 20 tools, like a busy fleet."""
    events: list[Event] = []
    for i in range(n // 2):
        program, call, ts = f"prog-{i % 100}", f"call-{i}", T0 + i * 0.01
        events.append(ToolStart(ts=ts, program_id=program, agent="coder", call_id=call, tool=f"tool-{i % 20}"))
        events.append(ToolEnd(ts=ts + 0.5, program_id=program, agent="coder", call_id=call, duration_s=0.5))
    return events


def with_refusals(events: list[Event], batch: int) -> list[Event]:
    """One event per batch that both databases refuse (a count just past 64 bits, which JSON
    encoding still accepts), at a different place in each batch."""
    out: list[Event] = []
    for n, start in enumerate(range(0, len(events), batch)):
        chunk = events[start : start + batch - 1]
        bad = LLMEnd(ts=T0 + n, program_id="prog-bad", request_id=f"r{n}", prompt_tokens=2**63, completion_tokens=1)
        at = (n * 7919) % len(chunk)
        out += chunk[:at] + [bad] + chunk[at:]
    return out


def rate(store: SessionStore, events: list[Event], batch: int) -> tuple[float, int, int]:
    """Events/s, and how many the store reported stored and rejected."""
    stored = rejected = 0
    began = time.perf_counter()
    for start in range(0, len(events), batch):
        result = store.write(events[start : start + batch])
        stored += result.stored
        rejected += len(result.rejected)
    return len(events) / (time.perf_counter() - began), stored, rejected


@contextmanager
def postgres_schemas(url: str | None) -> Iterator[Callable[[], str] | None]:
    """A maker of fresh schemas on ``url`` (None without PostgreSQL), all dropped at the end."""
    if not url:
        yield None
        return
    with throwaway_schemas(url, "bench") as fresh:
        yield fresh


def throughput(args: argparse.Namespace, sqlite: Callable[[], str], postgres: Callable[[], str] | None) -> dict[str, Any]:
    events = workload(args.events)
    poisoned = with_refusals(events, args.batch)
    result: dict[str, Any] = {}
    with SessionStore(sqlite()) as store:
        result["sqlite_events_per_s"] = round(rate(store, events, args.batch)[0])
    with SessionStore(sqlite()) as store:
        per_s, stored, rejected = rate(store, poisoned, args.batch)
        result |= {
            "sqlite_events_per_s_with_refusals": round(per_s),
            "refused_written": len(poisoned),
            "refused_stored": stored,
            "refused_rejected": rejected,
        }
    with SessionStore(sqlite()) as store:
        rows_per_s = rate(store, events[: args.row_events], 1)[0]
    result["postgres_events_per_s"] = result["postgres_events_per_s_with_refusals"] = None
    if postgres is not None:
        with SessionStore(postgres()) as store:
            result["postgres_events_per_s"] = round(rate(store, events, args.batch)[0])
        with SessionStore(postgres()) as store:
            per_s, stored, rejected = rate(store, poisoned, args.batch)
            assert (stored, rejected) == (result["refused_stored"], result["refused_rejected"])
            result["postgres_events_per_s_with_refusals"] = round(per_s)
    result["row_at_a_time_events_per_s"] = round(rows_per_s)
    print(
        f"{args.events} events in batches of {args.batch}; row-at-a-time baseline on {args.row_events} events (SQLite); "
        f"batched/row speed-up {result['sqlite_events_per_s'] / rows_per_s:.0f}x"
    )
    return result


# -- reliability --------------------------------------------------------------------------------


def _found(url: str, keys: set[str]) -> int:
    with SessionStore(url) as store, store.engine.connect() as conn:
        assert store.check_integrity() == [], url
        return len(keys & set(conn.scalars(select(EventRow.event_key))))


def kill_every_point(fresh: Callable[[], str], child: Any, stride: int) -> dict[str, int]:
    """kill -9 at every ``stride``-th point of a first write (two batches of 40 events)."""
    ctx = child.forkserver()
    report = Path(tempfile.mkdtemp()) / "r"

    def run(url: str, kill_at: int) -> list[tuple[str, int]]:
        report.unlink(missing_ok=True)
        process = ctx.Process(
            target=child.run_writer, args=(url, str(report)), kwargs={"writer": "w", "batches": 2, "size": 40, "kill_at": kill_at}
        )
        process.start()
        process.join()
        return child.reported(report)[0]

    run(fresh(), 0)
    points = child.reported(report)[1]
    figures = {"kills": 0, "written": 0, "stored": 0, "found": 0, "lost": 0}
    for kill_at in range(1, points + 1, stride):
        url = fresh()
        stored = run(url, kill_at)
        keys = set().union(set(), *(child.event_keys(child.batch_events(w, b, 40)) for w, b in stored))
        found = _found(url, keys)
        figures["kills"] += 1
        figures["written"] += 40 * min(len(stored) + 1, 2)
        figures["stored"] += len(keys)
        figures["found"] += found
        figures["lost"] += len(keys) - found
    return figures


def kill_mid_batch(fresh: Callable[[], str], child: Any, runs: int) -> dict[str, int]:
    """kill -9 at a random moment after a writer has stored two batches of 400 events."""
    ctx = child.forkserver()
    rng = random.Random(7)
    url = fresh()
    directory = Path(tempfile.mkdtemp())
    keys: set[str] = set()
    written = 0
    for n in range(runs):
        report = directory / f"r{n}"
        process = ctx.Process(
            target=child.run_writer, args=(url, str(report)), kwargs={"writer": f"w{n}", "batches": 10**6, "size": 400}
        )
        process.start()
        while len(child.reported(report)[0]) < 2 and process.is_alive():
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.05))
        process.kill()
        process.join()
        stored = child.reported(report)[0]
        written += 400 * (len(stored) + 1)
        keys |= set().union(*(child.event_keys(child.batch_events(w, b, 400)) for w, b in stored))
    found = _found(url, keys)
    return {"kills": runs, "written": written, "stored": len(keys), "found": found, "lost": len(keys) - found}


def concurrent_first_use(fresh: Callable[[], str], child: Any, writers: int = 4) -> dict[str, int]:
    """``writers`` processes start together on a new database; each writes 5 batches of 200
    events of its own plus 100 events every writer sends."""
    ctx = child.forkserver()
    url = fresh()
    directory = Path(tempfile.mkdtemp())
    start = ctx.Event()
    processes = [
        ctx.Process(
            target=child.run_writer,
            args=(url, str(directory / f"w{n}")),
            kwargs={
                "writer": f"w{n}",
                "batches": 5,
                "size": 200,
                "shared": 100,
                "start": start,
                "stderr": str(directory / f"e{n}"),
            },
        )
        for n in range(writers)
    ]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join()
    keys: set[str] = set()
    for b in range(5):
        keys |= child.event_keys(child.batch_events("shared", b, 100))
        for n in range(writers):
            keys |= child.event_keys(child.batch_events(f"w{n}", b, 200))
    with SessionStore(url) as store, store.engine.connect() as conn:
        rows = list(conn.scalars(select(EventRow.event_key)))
    return {
        "writers": writers,
        "written": writers * 5 * 300,
        "distinct": len(keys),
        "stored_rows": len(rows),
        "duplicates": len(rows) - len(set(rows)),
        "lost": len(keys - set(rows)),
        "failed_writers": sum(p.exitcode != 0 for p in processes),
        "stderr_lines": sum(len((directory / f"e{n}").read_text().splitlines()) for n in range(writers)),
    }


def full_disk(path: Path) -> dict[str, int]:
    """SQLite capped with ``max_page_count``: write 400-event batches until the database is
    full, then retry the refused batch once room is made."""
    url = f"sqlite:///{path}"
    written = stored = refused = 0
    with SessionStore(url) as store:
        event.listen(store.engine, "connect", lambda dbapi, _: dbapi.execute("PRAGMA max_page_count=256"))
        store.engine.dispose()  # new connections, with the cap
        for n in range(10**6):
            batch = [ToolStart(ts=T0 + n, program_id=f"p{n}", call_id=f"c{i}", tool="t") for i in range(400)]
            written += len(batch)
            try:
                stored += store.write(batch).stored
            except StoreUnavailable:
                refused = len(batch)
                break
        found_full = len(store.events())
    with SessionStore(url) as store:  # no cap: room again
        retried = store.write(batch).stored
        found = len(store.events())
    return {
        "written": written,
        "stored_before_full": stored,
        "found_when_full": found_full,
        "refused_as_outage": refused,
        "stored_on_retry": retried,
        "found": found,
        "lost": written - found,
    }


def reliability(args: argparse.Namespace, sqlite: Callable[[], str], postgres: Callable[[], str] | None) -> dict[str, Any]:
    from tests.faults import store_child as child

    out: dict[str, Any] = {}
    for name, fresh in (("sqlite", sqlite), ("postgres", postgres)):
        if fresh is None:
            out[f"{name}_reliability"] = None
            continue
        out[f"{name}_reliability"] = {
            "kill_every_point_of_first_write": kill_every_point(fresh, child, 1 if name == "sqlite" else 3),
            "kill_mid_batch": kill_mid_batch(fresh, child, 10),
            "concurrent_first_use": concurrent_first_use(fresh, child),
        }
    out["sqlite_reliability"]["full_disk"] = full_disk(Path(tempfile.mkdtemp()) / "full.db")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--row-events", type=int, default=2_000, help="events for the row-at-a-time baseline")
    parser.add_argument("--postgres", default=os.environ.get("MAITRED_TEST_POSTGRES_URL"))
    parser.add_argument("--reliability", action="store_true", help="add the fault scenarios' figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, postgres_schemas(args.postgres) as postgres:
        files = iter(range(10**6))

        def sqlite() -> str:
            return f"sqlite:///{Path(tmp) / f'bench-{next(files)}.db'}"

        result = throughput(args, sqlite, postgres)
        if args.reliability:
            result |= reliability(args, sqlite, postgres)
    result["reference_s"] = reference_s()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
