"""Time added per instrumented tool call, and end-to-end events/s from ``@maitred.tool`` into a store.

Per-call overhead: instrumented minus bare, sync and async, same run. The emitter is pointed at a
sink that discards batches so the figure is the caller's cost (building and queueing two
events), which is what the agent pays; delivery happens on the emitter's thread. Medians over
many rounds of ``--calls`` calls each, interleaving bare and instrumented rounds so machine noise
hits both alike. ``added_cpu_us_*`` is the same difference in the calling thread's CPU time,
which a machine shared with other work does not inflate (wall time includes being descheduled).

End to end: ``--e2e-calls`` back-to-back calls of a no-op ``@maitred.tool`` with default
settings into a fresh SQLite file and a fresh PostgreSQL schema (``--postgres`` or
``MAITRED_TEST_POSTGRES_URL``; null when neither is set), timed from the first call until
``flush()`` returns; ``end_to_end_dropped`` counts what the emitter dropped on the way (the
goal is 0). The store is opened (migrations run) before the clock starts.

OTLP export (``--otlp-rounds``; 0 skips it): a tool call's cost with the SQLite store sink alone
and with the OTLP sink beside it, exporting to a real OTLP/HTTP receiver on 127.0.0.1
(``tests/otlp_receiver.py``), measured as above (instrumented minus bare, medians of rounds,
the two configurations alternating round by round); ``otlp_added_us`` is the difference (the
goal is at most 2 µs). The span building and encoding run on the OTLP emitter's thread, so wall
time includes the share of the interpreter that thread takes; the CPU figures do not. Then
``--otlp-loss-calls`` tool calls while the receiver is down (a port that refuses), the
receiver started on that port, and ``flush()``: ``otlp_receiver_down`` says how many events
were dropped (the goal is 0 while the queue has room) and how many spans arrived; and the
same with a receiver that never comes back, where shutdown counts what it could not deliver.
``otlp_signals``: what ``maitred serve --otlp-endpoint`` adds per event it records on its loop to
note the runtime's signals for the span (``OtlpSink.note`` with the gateway's ``span_signals``, on
a ``LiveDriver`` holding a program with tool statistics): µs per ``llm.start`` (tier, worker), per
``tool.start`` (the predicted return) and per other event (passed over), medians of rounds, wall
and the calling thread's CPU time (``*_cpu_us``).

    python benchmarks/bench_middleware.py [--rounds 200] [--calls 2000] [--e2e-calls 100000] [--postgres URL]
        [--otlp-rounds 20] [--otlp-loss-calls 10000]
"""

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from reference import reference_s
from sqlalchemy import create_engine, text

import maitred
from maitred.middleware import EmitterSettings, config


class NullSink:
    def send(self, events) -> int:
        return 0

    def close(self) -> None:
        pass


def bare(x: int) -> int:
    return x + 1


async def abare(x: int) -> int:
    return x + 1


def per_call_us(fn, calls: int) -> tuple[float, float]:
    """(wall, this thread's CPU) microseconds per call."""
    began, cpu = time.perf_counter(), time.thread_time()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - began) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


async def aper_call_us(fn, calls: int) -> tuple[float, float]:
    began, cpu = time.perf_counter(), time.thread_time()
    for i in range(calls):
        await fn(i)
    return (time.perf_counter() - began) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


def added(instrumented: tuple[float, float], plain: tuple[float, float]) -> tuple[float, float]:
    return instrumented[0] - plain[0], instrumented[1] - plain[1]


def overhead(rounds: int, calls: int) -> dict[str, float]:
    maitred.configure(sinks=[NullSink()], settings=EmitterSettings(max_queue=1_000_000, batch_size=10_000))
    inst, ainst = maitred.tool(bare), maitred.tool(abare)
    added_sync, added_async = [], []
    loop = asyncio.new_event_loop()
    with maitred.program("bench", agent="bench"):
        for _ in range(rounds):
            added_sync.append(added(per_call_us(inst, calls), per_call_us(bare, calls)))
            added_async.append(
                added(
                    loop.run_until_complete(aper_call_us(ainst, calls)),
                    loop.run_until_complete(aper_call_us(abare, calls)),
                )
            )
    loop.close()
    maitred.shutdown()
    wall_sync, cpu_sync = zip(*added_sync)
    wall_async, cpu_async = zip(*added_async)
    print(
        f"overhead: rounds={rounds} calls/round={calls}; p90 sync {statistics.quantiles(wall_sync, n=10)[-1]:.2f} us, "
        f"p90 async {statistics.quantiles(wall_async, n=10)[-1]:.2f} us"
    )
    return {
        "added_us_sync": round(statistics.median(wall_sync), 2),
        "added_us_async": round(statistics.median(wall_async), 2),
        "added_cpu_us_sync": round(statistics.median(cpu_sync), 2),
        "added_cpu_us_async": round(statistics.median(cpu_async), 2),
    }


def end_to_end(url: str, calls: int) -> tuple[float, int]:
    """(events/s from the first call until flush returns, events dropped), default settings."""
    maitred.configure(db_url=url)
    noop = maitred.tool(name="e2e")(bare)
    noop(0)
    assert maitred.flush(timeout=120), "the store did not open"
    began = time.perf_counter()
    for i in range(calls):
        noop(i)
    maitred.flush(timeout=600)
    took = time.perf_counter() - began
    (stats,) = maitred.stats()
    maitred.shutdown()
    return 2 * calls / took, stats.dropped


def otlp_cost(rounds: int, calls: int, folder: Path) -> dict[str, float]:
    """Added µs per tool call with the store sink, and with the store and OTLP sinks, same run."""
    sys.path.insert(0, str(Path(__file__).parents[1]))  # the tests' OTLP receiver, one copy of it
    from tests.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver()
    store = f"sqlite:///{folder / 'otlp-cost.db'}"
    inst = maitred.tool(name="bench")(bare)
    runs: dict[str, list[tuple[float, float]]] = {"store": [], "store_otlp": []}
    try:
        for _ in range(rounds):
            for name, endpoint in (("store", None), ("store_otlp", receiver.url)):
                maitred.configure(db_url=store, otlp_endpoint=endpoint)
                with maitred.program(f"bench-{name}", agent="bench"):
                    inst(0)
                    assert maitred.flush(timeout=60), "the store did not open"
                    runs[name].append(added(per_call_us(inst, calls), per_call_us(bare, calls)))
                maitred.shutdown(timeout=60)
    finally:
        receiver.close()
    wall = {name: statistics.median(w for w, _ in rows) for name, rows in runs.items()}
    cpu = {name: statistics.median(c for _, c in rows) for name, rows in runs.items()}
    print(
        f"otlp cost: rounds={rounds} calls/round={calls}; per tool call {wall['store']:.2f} us with the store sink, "
        f"{wall['store_otlp']:.2f} us with the OTLP sink beside it ({len(receiver.spans)} spans received)"
    )
    return {
        "tool_call_us_store": round(wall["store"], 2),
        "tool_call_us_store_otlp": round(wall["store_otlp"], 2),
        "otlp_added_us": round(wall["store_otlp"] - wall["store"], 2),
        "tool_call_cpu_us_store": round(cpu["store"], 2),
        "tool_call_cpu_us_store_otlp": round(cpu["store_otlp"], 2),
        "otlp_added_cpu_us": round(cpu["store_otlp"] - cpu["store"], 2),
    }


def otlp_signals_cost(rounds: int, calls: int) -> dict[str, float]:
    """µs the gateway's loop spends noting each kind of event for its span."""
    from maitred.events import LLMStart, ProgramStart, ToolEnd, ToolStart
    from maitred.gateway.loop import LiveDriver
    from maitred.gateway.span_signals import span_signals
    from maitred.middleware.otlp import OtlpSink

    driver = LiveDriver(backends={})
    sink = OtlpSink("http://127.0.0.1:9", annotate=lambda event: span_signals(driver.state, event, driver.clock()))
    t = time.time() - 100
    history = [ProgramStart(ts=t, program_id="p")]
    for i in range(10):
        history += [
            ToolStart(ts=t + i, program_id="p", call_id=f"h{i}", tool="pytest"),
            ToolEnd(ts=t + i + 0.5, program_id="p", call_id=f"h{i}", duration_s=0.5),
        ]
    now = time.time()  # a start is noted as it is recorded: its tool has just started
    driver.ingest([*history, ToolStart(ts=now, program_id="p", call_id="open", tool="pytest")])
    kinds = {
        "llm_start_us": LLMStart(ts=now, program_id="p", request_id="r"),
        "tool_start_us": ToolStart(ts=now, program_id="p", call_id="open", tool="pytest"),
        "other_us": ToolEnd(ts=now, program_id="p", call_id="open"),
    }
    assert "maitred.predicted_return_s" in span_signals(driver.state, kinds["tool_start_us"], driver.clock())
    figures = {}
    for name, event in kinds.items():
        note = functools.partial(lambda e, _: sink.note(e), event)
        wall, cpu = zip(*(per_call_us(note, calls) for _ in range(rounds)))
        figures[name] = round(statistics.median(wall), 2)
        figures[name.replace("_us", "_cpu_us")] = round(statistics.median(cpu), 2)
    print(f"otlp signals: rounds={rounds} calls/round={calls}; per event noted {json.dumps(figures)}")
    return figures


def otlp_loss(calls: int) -> dict[str, Any]:
    """Events lost while the receiver is down: kept and delivered when it comes back; counted
    when it never does."""
    from maitred.harness.background import free_port
    from tests.otlp_receiver import OtlpReceiver

    inst = maitred.tool(name="bench")(bare)
    result: dict[str, Any] = {"tool_calls": calls, "events": 2 * calls + 2}
    for comes_back in (True, False):
        port = free_port()
        maitred.configure(sinks=[], otlp_endpoint=f"http://127.0.0.1:{port}")
        with maitred.program(f"bench-down-{comes_back}", agent="bench"):
            for i in range(calls):
                inst(i)
        maitred.flush(timeout=2.0)  # refused: nothing can go yet
        (down,) = maitred.stats()
        if comes_back:
            receiver = OtlpReceiver(port)
            began = time.perf_counter()
            delivered_all = maitred.flush(timeout=300)
            took = time.perf_counter() - began
            (stats,) = maitred.stats()
            maitred.shutdown()
            receiver.close()
            result["back"] = {
                "queued_while_down": down.queued,
                "dropped_while_down": down.dropped,
                "dropped": stats.dropped,
                "delivered": stats.delivered,
                "flush_ok": delivered_all,
                "spans_received": len(receiver.spans),
                "spans_expected": calls + 1,
                "seconds_to_deliver_once_back": round(took, 2),
            }
        else:
            (emitter,) = config._emitters or []  # its counters outlive the shutdown
            began = time.perf_counter()
            maitred.shutdown(timeout=5.0)
            took = time.perf_counter() - began
            result["never_back"] = {
                "queued_at_shutdown": down.queued,
                "dropped_counted": emitter.stats().dropped,
                "delivered": emitter.stats().delivered,
                "shutdown_s": round(took, 2),
            }
    print(f"otlp receiver down: {json.dumps(result)}")
    return result


def postgres_schema(url: str) -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with create_engine(url).begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in url else "?"
    return schema, f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--e2e-calls", type=int, default=100_000)
    parser.add_argument("--postgres", default=os.environ.get("MAITRED_TEST_POSTGRES_URL"))
    parser.add_argument("--otlp-rounds", type=int, default=20, help="rounds of the OTLP cost (0: skip the OTLP figures)")
    parser.add_argument("--otlp-loss-calls", type=int, default=10_000)
    args = parser.parse_args()
    result: dict[str, object] = overhead(args.rounds, args.calls)
    if args.otlp_rounds:
        with tempfile.TemporaryDirectory() as tmp:
            result["otlp"] = otlp_cost(args.otlp_rounds, args.calls, Path(tmp))
        result["otlp_signals"] = otlp_signals_cost(args.otlp_rounds, args.calls)
        result["otlp_receiver_down"] = otlp_loss(args.otlp_loss_calls)
    rates: dict[str, float | None] = {"sqlite": None, "postgresql": None}
    dropped: dict[str, int | None] = {"sqlite": None, "postgresql": None}
    with tempfile.TemporaryDirectory() as tmp:
        rate, lost = end_to_end(f"sqlite:///{Path(tmp) / 'e2e.db'}", args.e2e_calls)
        rates["sqlite"], dropped["sqlite"] = round(rate), lost
    if args.postgres:
        schema, url = postgres_schema(args.postgres)
        try:
            rate, lost = end_to_end(url, args.e2e_calls)
            rates["postgresql"], dropped["postgresql"] = round(rate), lost
        finally:
            with create_engine(args.postgres).begin() as conn:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    print(
        f"end to end: {args.e2e_calls} tool calls ({2 * args.e2e_calls} events), default settings: "
        + ", ".join(f"{k} {v} events/s, {dropped[k]} dropped" for k, v in rates.items() if v is not None)
    )
    result.update(end_to_end_events_per_s=rates, end_to_end_dropped=dropped)
    result["reference_s"] = reference_s()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
