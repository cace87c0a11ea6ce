"""Events/s ingested by ``SessionStore.write``: batched on SQLite and PostgreSQL, against the
same store fed one event per transaction (row at a time) in the same run.

    python benchmarks/bench_store.py [--events 100000] [--batch 1000] [--postgres URL]

PostgreSQL comes from ``--postgres`` or ``MAITRED_TEST_POSTGRES_URL``; it is skipped (null in
the figures) when neither is set. Each database gets a fresh schema, dropped afterwards.
"""

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, text

from maitred.events import Event, ToolEnd, ToolStart
from maitred.storage import SessionStore

T0 = time.time() - 86_400


def workload(n: int) -> list[Event]:
    """Tool start/end pairs spread over 100 programs and 20 tools, like a busy fleet."""
    events: list[Event] = []
    for i in range(n // 2):
        program, call, ts = f"prog-{i % 100}", f"call-{i}", T0 + i * 0.01
        events.append(ToolStart(ts=ts, program_id=program, agent="coder", call_id=call, tool=f"tool-{i % 20}"))
        events.append(ToolEnd(ts=ts + 0.5, program_id=program, agent="coder", call_id=call, duration_s=0.5))
    return events


def rate(store: SessionStore, events: list[Event], batch: int) -> float:
    began = time.perf_counter()
    for start in range(0, len(events), batch):
        store.write(events[start:start + batch])
    return len(events) / (time.perf_counter() - began)


def postgres_schema(url: str) -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with create_engine(url).begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in url else "?"
    return schema, f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--row-events", type=int, default=2_000, help="events for the row-at-a-time baseline")
    parser.add_argument("--postgres", default=os.environ.get("MAITRED_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    events = workload(args.events)
    result: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        with SessionStore(f"sqlite:///{Path(tmp) / 'batched.db'}") as store:
            result["sqlite_events_per_s"] = round(rate(store, events, args.batch))
        with SessionStore(f"sqlite:///{Path(tmp) / 'rows.db'}") as store:
            result_rows = rate(store, events[: args.row_events], 1)
    result["postgres_events_per_s"] = None
    if args.postgres:
        schema, url = postgres_schema(args.postgres)
        try:
            with SessionStore(url) as store:
                result["postgres_events_per_s"] = round(rate(store, events, args.batch))
        finally:
            with create_engine(args.postgres).begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    result["row_at_a_time_events_per_s"] = round(result_rows)
    print(f"{args.events} events in batches of {args.batch}; row-at-a-time baseline on {args.row_events} events (SQLite); "
          f"batched/row speed-up {result['sqlite_events_per_s'] / result_rows:.0f}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
