"""What a gateway restarted on its store pays to rebuild its live state: ``--programs``
programs not ended, each with ``--events`` events (llm.start/llm.end steps and tool calls, the
last tool left open), among as many ended programs and older history that the query must skip;
then ``SessionStore.open_program_events`` (the read) and ``RuntimeState.restore`` (the replay)
are timed, as ``maitred serve`` runs them before serving its first request.

    python benchmarks/bench_restore.py [--programs 10000] [--events 10] [--postgres URL]

Prints one JSON object on its last line (seconds per backend; PostgreSQL from ``--postgres`` or
``MAITRED_TEST_POSTGRES_URL``, null when neither is set).
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from maitred.events import Event, LLMEnd, LLMStart, ProgramEnd, ToolEnd, ToolStart
from maitred.runtime.records import WorkerState
from maitred.runtime.state import RuntimeState
from maitred.storage import SessionStore

WORKERS = ("http://w0", "http://w1")


def history(programs: int, per_program: int, now: float) -> list[Event]:
    out: list[Event] = []
    for i in range(2 * programs):  # the second half ends: the query skips them
        pid, t = f"p{i}", now - 600 + i * 1e-3
        for step in range((per_program - 1) // 4 + 1):
            rid, call = f"r{step}", f"c{step}"
            out += [
                LLMStart(ts=t, program_id=pid, request_id=rid, prompt_tokens=1000 + step),
                LLMEnd(ts=t + 1, program_id=pid, request_id=rid, prompt_tokens=1000, completion_tokens=50, worker=WORKERS[i % 2]),
                ToolStart(ts=t + 1.1, program_id=pid, call_id=call, tool="pytest"),
                ToolEnd(ts=t + 2, program_id=pid, call_id=call, status="ok"),
            ]
            t += 3
        out = out[: len(out) - 1]  # the last tool call stays open
        if i >= programs:
            out.append(ProgramEnd(ts=t + 5, program_id=pid))
    return out


def measure(url: str, programs: int, per_program: int) -> dict[str, Any]:
    now = time.time()
    events = history(programs, per_program, now)
    with SessionStore(url) as store:
        for i in range(0, len(events), 5000):
            store.write(events[i : i + 5000])
        started = time.perf_counter()
        replay = store.open_program_events(now - 3600)
        read_s = time.perf_counter() - started
    state = RuntimeState([WorkerState(w, gpu_tokens=10**7) for w in WORKERS])
    started = time.perf_counter()
    restored = state.restore(replay)
    replay_s = time.perf_counter() - started
    assert len(restored) == programs
    return {
        "stored_events": len(events),
        "replayed_events": len(replay),
        "read_s": round(read_s, 3),
        "replay_s": round(replay_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--postgres", default=os.environ.get("MAITRED_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    figures: dict[str, Any] = {"programs": args.programs, "events_per_program": args.events}
    with tempfile.TemporaryDirectory() as tmp:
        figures["sqlite"] = measure(f"sqlite:///{Path(tmp) / 'restore.db'}", args.programs, args.events)
    figures["postgresql"] = None
    if args.postgres:
        from tests.helpers import throwaway_schemas

        with throwaway_schemas(args.postgres, "bench") as make:
            figures["postgresql"] = measure(make(), args.programs, args.events)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
