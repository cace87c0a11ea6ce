import asyncio
import contextvars
import logging
import subprocess
import sys
import threading
import time
import traceback

import pytest
from sqlalchemy import create_engine, text

import maitred
from maitred.middleware import EmitterSettings
from maitred.storage import SessionStore
from tests.helpers import ListSink, free_port


@pytest.fixture
def sink():
    sink = ListSink()
    maitred.configure(sinks=[sink], settings=EmitterSettings(interval_s=0.05))
    return sink


def flushed(sink: ListSink) -> ListSink:
    assert maitred.flush(timeout=5)
    return sink


def test_sync_async_generator_and_async_generator_tools_are_recorded(sink):
    @maitred.tool
    def add(a: int, b: int) -> int:
        return a + b

    @maitred.tool(name="sleepy", timeout=5)
    async def nap() -> str:
        await asyncio.sleep(0.01)
        return "rested"

    @maitred.tool
    def count(n: int):
        yield from range(n)
        return "done"

    @maitred.tool
    async def acount(n: int):
        for i in range(n):
            yield i

    async def collect():
        return [x async for x in acount(3)]

    with maitred.program("p-1", agent="coder"):
        assert add(2, 3) == 5
        assert asyncio.run(nap()) == "rested"
        gen = count(2)
        assert list(gen) == [0, 1]
        assert asyncio.run(collect()) == [0, 1, 2]

    events = flushed(sink).events
    starts = [e for e in events if e.TYPE == "tool.start"]
    ends = [e for e in events if e.TYPE == "tool.end"]
    assert [e.tool for e in starts] == ["add", "sleepy", "count", "acount"]
    assert [e.status for e in ends] == ["ok"] * 4
    assert {e.program_id for e in starts + ends} == {"p-1"} and {e.agent for e in starts} == {"coder"}
    assert starts[1].deadline_s == 5
    assert [s.call_id for s in starts] == [e.call_id for e in ends]
    assert ends[1].duration_s >= 0.01
    assert [e.TYPE for e in (events[0], events[-1])] == ["program.start", "program.end"]


def test_generator_return_value_and_send_pass_through(sink):
    @maitred.tool
    def echo():
        got = yield "first"
        yield f"got {got}"
        return "finished"

    gen = echo()
    assert next(gen) == "first"
    assert gen.send("x") == "got x"
    with pytest.raises(StopIteration) as info:
        next(gen)
    assert info.value.value == "finished"
    assert flushed(sink).of_type("tool.end")[0].status == "ok"


def test_async_generator_closed_early_records_interrupted(sink):
    @maitred.tool
    async def stream():
        for i in range(100):
            yield i

    async def first_two():
        agen = stream()
        out = [await agen.__anext__(), await agen.__anext__()]
        await agen.aclose()
        return out

    assert asyncio.run(first_two()) == [0, 1]
    assert flushed(sink).of_type("tool.end")[0].status == "interrupted"


class Boom(Exception):
    pass


def test_tool_exception_comes_out_unchanged_and_is_recorded_as_error(sink):
    raised = Boom("disk on fire")

    @maitred.tool
    def explode(x: int) -> None:
        raise raised

    with pytest.raises(Boom) as info:
        explode(1)
    assert info.value is raised
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].name == "explode" and frames[-1].line == "raise raised"

    @maitred.tool
    async def aexplode() -> None:
        raise TimeoutError("slow")

    with pytest.raises(TimeoutError):
        asyncio.run(aexplode())
    assert [e.status for e in flushed(sink).of_type("tool.end")] == ["error", "timeout"]


def test_langchain_tool_on_top_keeps_name_docstring_and_schema(sink):
    from langchain_core.tools import tool as lc_tool

    def search(query: str, limit: int = 5) -> str:
        """Search the codebase for a query."""
        return f"{query}:{limit}"

    async def fetch(url: str) -> str:
        """Fetch a URL."""
        return url.upper()

    wrapped = lc_tool(maitred.tool(search))
    bare = lc_tool(search)
    assert wrapped.name == "search"
    assert wrapped.description == "Search the codebase for a query."
    assert wrapped.args == bare.args
    assert wrapped.args_schema.model_json_schema() == bare.args_schema.model_json_schema()
    assert wrapped.invoke({"query": "def main", "limit": 2}) == "def main:2"

    awrapped = lc_tool(maitred.tool(fetch))
    assert awrapped.args == lc_tool(fetch).args
    assert asyncio.run(awrapped.ainvoke({"url": "x"})) == "X"
    assert [e.tool for e in flushed(sink).of_type("tool.start")] == ["search", "fetch"]


def test_deadline_read_from_each_call_in_milliseconds(sink):
    @maitred.tool(name="Bash", deadline_arg="timeout", deadline_unit="ms", timeout=120)
    def bash(command: str, timeout: int | None = None) -> str:
        return command

    bash("ls", timeout=30_000)
    bash("ls", 5_000)
    bash("ls")
    assert [e.deadline_s for e in flushed(sink).of_type("tool.start")] == [30.0, 5.0, 120]


def test_bad_decorator_arguments_fail_at_decoration_time():
    with pytest.raises(ValueError, match="deadline_arg 'timeout' is not a parameter"):
        maitred.tool(deadline_arg="timeout")(lambda command: command)
    with pytest.raises(ValueError, match="deadline_unit"):
        maitred.tool(deadline_arg="t", deadline_unit="h")(lambda t: t)
    with pytest.raises(ValueError, match="timeout must be positive"):
        maitred.tool(timeout=0)(lambda: None)


def test_tool_call_block_reports_progress_and_errors(sink):
    with maitred.program("p-2"):
        with maitred.tool_call("pytest", timeout=30, signature="Bash:pytest") as call:
            call.progress(fraction=0.5, eta_s=3.0)
        with pytest.raises(KeyError):
            with maitred.tool_call("lookup"):
                raise KeyError("missing")
    events = flushed(sink).events
    progress = [e for e in events if e.TYPE == "tool.progress"][0]
    assert (progress.fraction, progress.eta_s, progress.call_id) == (0.5, 3.0, call.call_id)
    assert [e.status for e in events if e.TYPE == "tool.end"] == ["ok", "error"]
    assert [e.signature for e in events if e.TYPE == "tool.start"] == ["Bash:pytest", None]
    assert events[-1].TYPE == "program.end" and events[-1].status == "ok"


def test_program_left_by_an_exception_ends_with_error_and_the_exception_passes(sink):
    with pytest.raises(KeyError):
        with maitred.program("p-3"):
            raise KeyError("x")
    end = flushed(sink).of_type("program.end")[0]
    assert (end.program_id, end.status) == ("p-3", "error")


def test_context_follows_asyncio_tasks_and_copied_threads(sink):
    @maitred.tool
    def where() -> str:
        return threading.current_thread().name

    async def main():
        async with maitred.program("p-async", agent="a"):
            await asyncio.gather(asyncio.to_thread(where), asyncio.create_task(asyncio.to_thread(where)))

    asyncio.run(main())
    with maitred.program("p-thread", agent="b"):
        ctx = contextvars.copy_context()
        t = threading.Thread(target=ctx.run, args=(where,))
        t.start()
        t.join()
    starts = flushed(sink).of_type("tool.start")
    assert [(e.program_id, e.agent) for e in starts] == [("p-async", "a")] * 2 + [("p-thread", "b")]


def test_nested_program_records_its_parent_and_handoff_switches_agent(sink):
    with maitred.program("parent", agent="planner"):
        maitred.handoff("coder", messages=[{"role": "user", "content": "fix it"}], child_program_id="child")
        with maitred.program("child", agent="coder"):
            pass
        with maitred.agent("reviewer"):
            maitred.handoff("planner")
    events = flushed(sink).events
    child_start = [e for e in events if e.TYPE == "program.start" and e.program_id == "child"][0]
    assert child_start.parent_program_id == "parent"
    first, second = [e for e in events if e.TYPE == "handoff"]
    assert (first.from_agent, first.to_agent, first.child_program_id) == ("planner", "coder", "child")
    assert first.context_hash and len(first.context_hash) == 32
    assert (second.from_agent, second.program_id) == ("reviewer", "parent")


def test_tool_outside_any_program_is_recorded_under_the_process_program(sink):
    maitred.tool(lambda: 1)()
    assert flushed(sink).of_type("tool.start")[0].program_id.startswith("process:")


def test_store_down_does_not_break_the_tool_and_flush_honours_its_timeout():
    dead = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    maitred.configure(db_url=dead)

    @maitred.tool
    def work(x: int) -> int:
        return x * 2

    with maitred.program("p-down"):
        assert [work(i) for i in range(50)] == [i * 2 for i in range(50)]
    began = time.monotonic()
    assert maitred.flush(timeout=1) is False
    assert time.monotonic() - began < 20  # a guard on a loaded machine: the timeout is 1 s, a hang would be forever
    (stats,) = maitred.stats()
    assert stats.queued == 102 and stats.delivered == 0
    assert "StoreUnavailable" in stats.last_error and "Connection refused" in stats.last_error
    from maitred.middleware import config

    (emitter,) = config._emitters
    assert maitred.shutdown(timeout=0.2) is False
    assert emitter.dropped == 102  # what could not go is counted as dropped, not silently lost


def test_events_are_flushed_at_interpreter_exit(tmp_path):
    db = tmp_path / "exit.db"
    script = (
        "import maitred\n"
        f"maitred.configure(db_url='sqlite:///{db}')\n"
        "with maitred.program('p-exit'):\n"
        "    [maitred.tool(lambda: 1)() for _ in range(500)]\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with SessionStore(f"sqlite:///{db}") as store:
        assert store.tool_stats().n == 500
        assert store.program("p-exit").program.status == "ok"


def test_events_reach_a_real_store(telemetry, tmp_path):
    @maitred.tool
    def slow() -> str:
        time.sleep(0.02)
        return "ok"

    with maitred.program("p-store", agent="a"):
        slow()
        slow()
    assert maitred.flush(timeout=10)
    with SessionStore(telemetry) as store:
        stats = store.tool_stats("slow")
        assert stats.n == 2 and stats.min_s >= 0.02
        assert store.program("p-store").program.status == "ok"


def test_a_bad_value_from_the_agent_is_refused_alone_and_counted(telemetry):
    with maitred.program("x" * 10_240):
        pass
    with maitred.program("p-good"):
        maitred.tool(lambda: 1)()
    assert maitred.flush(timeout=10) is False  # two events were not stored: flush says so
    (stats,) = maitred.stats()
    assert stats.dropped == stats.rejected == 2 and stats.delivered == 4
    assert maitred.flush(timeout=10) is True  # nothing dropped since
    with SessionStore(telemetry) as store:
        assert [p.program_id for p in store.programs()] == ["p-good"]


def _deep_attrs(levels: int) -> dict:
    root: dict = {}
    node = root
    for _ in range(levels - 1):
        node["k"] = {}
        node = node["k"]
    return root


def test_values_the_database_cannot_hold_are_refused_alone_and_the_calls_around_them_are_stored(db_url, caplog):
    """Hostile values: attrs nested 300 deep, 10**20 and 3e9 tokens, a NUL byte in a tool name."""
    maitred.configure(db_url=db_url, settings=EmitterSettings(interval_s=0.05))

    @maitred.tool
    def good(i: int) -> int:
        return i

    with caplog.at_level(logging.WARNING, "maitred"):
        with maitred.program("p-mixed"):
            for i in range(10):
                good(i)
            with maitred.program("p-deep", attrs=_deep_attrs(300)):
                pass
            with maitred.llm_call(model="m", prompt_tokens=10**20) as step:
                step.finish(completion_tokens=3_000_000_000)
            maitred.tool(name="nul\x00name")(lambda: 1)()
            for i in range(10, 20):
                good(i)
        assert maitred.flush(timeout=30) is False
    (stats,) = maitred.stats()
    # refused: program.start (attrs), llm.start and llm.end (10**20), tool.start (NUL)
    assert stats.rejected == stats.dropped == 4 and stats.delivered == 44  # of 48 emitted
    assert "attrs.k.k" in caplog.text and "prompt_tokens" in caplog.text and "tool: contains a NUL byte" in caplog.text
    with SessionStore(db_url) as store:
        assert store.tool_stats("good").n == 20
        assert {p.program_id for p in store.programs()} >= {"p-mixed", "p-deep"}


def test_a_database_from_a_newer_maitred_is_reported_once_and_its_events_counted_dropped(tmp_path, caplog):
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    SessionStore(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed0099'"))
    engine.dispose()
    maitred.configure(db_url=url, settings=EmitterSettings(interval_s=0.05))
    with caplog.at_level(logging.WARNING, "maitred"):
        for _ in range(3):
            with maitred.program("p-new"):
                maitred.tool(lambda: 1)()
            assert maitred.flush(timeout=10) is False
    (stats,) = maitred.stats()
    assert stats.dropped == 12 and stats.delivered == 0 and stats.queued == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["maitred: this database was written by a newer maitred (revision f00dfeed0099)"]
    assert "unavailable" not in caplog.text  # not an outage: nothing is retried


def test_events_the_database_refuses_are_isolated_and_counted(db_url, caplog):
    """The store splits a batch the database refuses; the sink counts the refused events."""
    SessionStore(db_url).close()
    engine = create_engine(db_url)
    with engine.begin() as conn:
        if db_url.startswith("postgresql"):
            conn.execute(text("ALTER TABLE tool_calls ADD CONSTRAINT no_poison CHECK (tool <> 'poison')"))
        else:
            conn.execute(
                text(
                    "CREATE TRIGGER no_poison BEFORE INSERT ON tool_calls WHEN NEW.tool = 'poison' "
                    "BEGIN SELECT RAISE(ABORT, 'tool: poison refused'); END"
                )
            )
    engine.dispose()
    maitred.configure(db_url=db_url, settings=EmitterSettings(interval_s=0.05))

    @maitred.tool
    def fine() -> int:
        return 1

    with caplog.at_level(logging.WARNING, "maitred"):
        with maitred.program("p-poison"):
            fine()
            maitred.tool(name="poison")(lambda: 1)()
            fine()
        assert maitred.flush(timeout=30) is False
    (stats,) = maitred.stats()
    assert stats.rejected == stats.dropped == 1 and stats.delivered == 7
    assert "the store refused a tool.start event" in caplog.text
    with SessionStore(db_url) as store:
        assert store.tool_stats("fine").n == 2


def test_a_file_that_is_not_a_database_is_reported_once_and_never_retried(tmp_path, caplog):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an SQLite database, just a file someone pointed us at" * 100)
    maitred.configure(db_url=f"sqlite:///{path}", settings=EmitterSettings(interval_s=0.05))
    with caplog.at_level(logging.WARNING, "maitred"):
        for _ in range(2):
            maitred.tool(lambda: 1)()
            assert maitred.flush(timeout=10) is False
    (stats,) = maitred.stats()
    assert (stats.dropped, stats.delivered) == (4, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "database is corrupt" in errors[0] and str(path) in errors[0]
    assert path.read_bytes().startswith(b"this is not an SQLite database")  # never written to
