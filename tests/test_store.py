import json
import re
import uuid

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.engine import make_url

from maitred.events import Handoff, LLMEnd, ProgramStart, ToolEnd, ToolStart, decode_batch
from maitred.storage import (
    ALL_TOOLS,
    DatabaseCorrupt,
    DatabaseTooNew,
    NoSuchDatabase,
    SessionStore,
    StoreError,
    normalize_db_url,
)
from maitred.storage.migrate import scripts
from maitred.storage.models import Base, EventRow, ToolCallRow

T0 = 1_800_000_000.0


def tool_events(program: str, tool: str, durations, *, start=T0, agent="a", signature=None):
    out, t = [], start
    for i, d in enumerate(durations):
        out.append(
            {
                "type": "tool.start",
                "ts": t,
                "program_id": program,
                "agent": agent,
                "call_id": f"{tool}-{i}",
                "tool": tool,
                **({"signature": signature} if signature else {}),
            }
        )
        out.append(
            {"type": "tool.end", "ts": t + d, "program_id": program, "agent": agent, "call_id": f"{tool}-{i}", "duration_s": d}
        )
        t += d + 1
    return out


def write(store: SessionStore, raw: list[dict]) -> int:
    batch = decode_batch(raw, now=T0 + 10**6)
    assert not batch.rejected, batch.rejected
    return store.write(batch.events).stored


@pytest.fixture
def store(db_url):
    with SessionStore(db_url) as s:
        yield s


def test_migrations_create_exactly_the_models(store):
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_tool_stats_equal_numpy_on_the_same_durations(store):
    rng = np.random.default_rng(7)
    durations = rng.lognormal(0.0, 1.2, size=257).round(6)
    write(store, tool_events("p1", "pytest", durations[:200]) + tool_events("p2", "pytest", durations[200:], agent="b"))
    write(store, tool_events("p3", "grep", [0.01, 0.02, 0.03]))
    stats = store.tool_stats("pytest")
    assert stats.n == 257
    np.testing.assert_allclose(
        [stats.mean_s, stats.std_s, stats.min_s, stats.max_s, stats.p50_s, stats.p90_s, stats.p99_s],
        [durations.mean(), durations.std(ddof=1), durations.min(), durations.max(), *np.percentile(durations, [50, 90, 99])],
        rtol=1e-12,
    )
    assert store.tool_stats("pytest", agent="b").n == 57
    assert store.tool_stats("nope") is None
    rows = store.tool_stats_all()
    assert [r.tool for r in rows] == ["grep", "pytest", ALL_TOOLS]
    everything = np.concatenate([durations, [0.01, 0.02, 0.03]])
    assert rows[-1].n == 260 and rows[-1].p90_s == pytest.approx(np.percentile(everything, 90), rel=1e-12)


def test_since_keeps_only_calls_that_ended_after(store):
    write(store, tool_events("p", "t", [1.0] * 10, start=T0))
    later = tool_events("q", "t", [2.0] * 4, start=T0 + 1000)
    write(store, later)
    assert store.tool_stats("t", since=T0 + 500).n == 4
    assert store.tool_stats("t").n == 14


def test_stats_by_signature_separate_commands_of_one_tool(store):
    write(store, tool_events("p", "Bash", [30.0] * 5, signature="Bash:pytest"))
    write(store, tool_events("q", "Bash", [0.01] * 5, signature="Bash:ls"))
    by_sig = {r.tool: r for r in store.tool_stats_all(by_signature=True)}
    assert by_sig["Bash:pytest"].mean_s == 30.0 and by_sig["Bash:ls"].mean_s == 0.01
    assert store.tool_stats(signature="Bash:ls").n == 5


def test_resending_a_batch_counts_nothing_twice(store):
    raw = tool_events("p", "grep", [0.5, 1.5]) + [
        {"type": "program.start", "ts": T0 - 1, "program_id": "p", "agent": "a"},
        {"type": "llm.end", "ts": T0 + 5, "program_id": "p", "request_id": "r1", "prompt_tokens": 100, "completion_tokens": 9},
        {"type": "handoff", "ts": T0 + 6, "program_id": "p", "from_agent": "a", "to_agent": "b", "messages": [{"m": 1}]},
    ]
    assert write(store, raw) == 7
    write(store, raw)
    write(store, raw + raw)
    with store.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(EventRow)) == 7
        assert conn.scalar(select(func.count()).select_from(ToolCallRow)) == 2
    assert store.tool_stats("grep").n == 2
    timeline = store.program("p")
    assert len(timeline.handoffs) == 1 and timeline.handoffs[0]["n_messages"] == 1
    assert [s.kind for s in timeline.spans].count("llm") == 1


def test_good_events_of_a_batch_with_bad_ones_are_stored_once(store):
    raw = tool_events("p", "grep", [0.2]) + [
        {"type": "tool.start", "ts": T0, "program_id": "p", "tool": "grep"},  # missing call_id
        {"type": "tool.start", "ts": "yesterday", "program_id": "p", "call_id": "x", "tool": "grep"},
        {"type": "warp.drive", "ts": T0, "program_id": "p"},
        {"type": "program.end", "ts": T0, "program_id": "p" * 10_240},
    ]
    batch = decode_batch(raw, now=T0 + 10)
    assert [r.field for r in batch.rejected] == ["call_id", "ts", "type", "program_id"]
    store.write(batch.events)
    store.write(batch.events)
    assert store.tool_stats("grep").n == 1
    assert len(store.events()) == 2


def test_tool_end_arriving_before_its_start_still_makes_one_complete_call(store):
    start, end = tool_events("p", "slow", [3.0])
    write(store, [end])
    assert store.tool_stats("slow") is None  # the tool's name only comes with tool.start
    write(store, [start])
    assert store.tool_stats("slow").n == 1
    timeline = store.program("p")
    (span,) = timeline.spans
    assert (span.start, span.end, span.status) == (T0, T0 + 3.0, "ok")


def test_a_program_seen_only_through_the_gateway_lists_with_its_agent_and_first_event(store):
    """The gateway records model calls but no program.start: the program is listed with the
    agent of its first model call and the time of its first event. A program.start, when there
    is one (even sent after the calls), still decides both."""
    write(
        store,
        [
            {"type": "llm.start", "ts": T0 + 5, "program_id": "gw", "agent": "coder", "request_id": "r1"},
            {
                "type": "llm.end",
                "ts": T0 + 6,
                "program_id": "gw",
                "agent": "coder",
                "request_id": "r1",
                "prompt_tokens": 10,
                "completion_tokens": 2,
            },
            {"type": "llm.start", "ts": T0 + 9, "program_id": "gw", "agent": "reviewer", "request_id": "r2"},
            {"type": "llm.start", "ts": T0 + 1, "program_id": "sdk", "agent": "coder", "request_id": "r1"},
            {"type": "program.start", "ts": T0, "program_id": "sdk", "agent": "planner"},
        ],
    )
    listed = {p.program_id: (p.agent, p.started_at) for p in store.programs()}
    assert listed == {"gw": ("coder", T0 + 5), "sdk": ("planner", T0)}
    assert [p.program_id for p in store.programs(since=T0 + 2)] == ["gw"]
    timeline = store.program("gw")
    assert timeline is not None and (timeline.program.agent, timeline.program.started_at) == ("coder", T0 + 5)


def test_program_timeline_has_phases_waits_and_busy_idle_totals(store):
    write(
        store,
        [
            {"type": "program.start", "ts": T0, "program_id": "p", "agent": "planner", "framework": "custom"},
            {"type": "llm.start", "ts": T0, "program_id": "p", "request_id": "r1", "prompt_tokens": 1000},
            {
                "type": "llm.end",
                "ts": T0 + 2,
                "program_id": "p",
                "request_id": "r1",
                "prompt_tokens": 1000,
                "cached_tokens": 900,
                "completion_tokens": 50,
            },
            *tool_events("p", "pytest", [5.0], start=T0 + 2),
            {"type": "program.wait", "ts": T0 + 8, "program_id": "p"},
            {"type": "program.resume", "ts": T0 + 20, "program_id": "p"},
            {"type": "program.end", "ts": T0 + 21, "program_id": "p", "status": "ok"},
        ],
    )
    timeline = store.program("p")
    assert [s.kind for s in timeline.spans] == ["llm", "tool", "wait"]
    assert timeline.busy_idle() == {"reasoning_s": 2.0, "acting_s": 5.0, "waiting_s": 12.0}
    assert timeline.program.tool_calls == 1 and timeline.program.llm_calls == 1
    assert store.program("unknown") is None
    (summary,) = store.programs()
    assert (summary.program_id, summary.framework, summary.status) == ("p", "custom", "ok")


def test_export_trace_writes_the_documented_format(store, tmp_path):
    write(
        store,
        [
            {"type": "program.start", "ts": T0, "program_id": "p", "agent": "planner"},
            {"type": "llm.start", "ts": T0, "program_id": "p", "request_id": "r1"},
            {
                "type": "llm.end",
                "ts": T0 + 1,
                "program_id": "p",
                "request_id": "r1",
                "prompt_tokens": 500,
                "completion_tokens": 20,
            },
            {"type": "tool.start", "ts": T0 + 1, "program_id": "p", "call_id": "c", "tool": "Bash", "deadline_s": 120.0},
            {"type": "tool.end", "ts": T0 + 4, "program_id": "p", "call_id": "c", "status": "ok"},
            {
                "type": "handoff",
                "ts": T0 + 5,
                "program_id": "p",
                "from_agent": "planner",
                "to_agent": "coder",
                "context_tokens": 520,
            },
            {"type": "program.start", "ts": T0 + 100, "program_id": "q", "parent_program_id": "p"},
        ],
    )
    out = tmp_path / "trace.jsonl"
    assert store.export_trace(out) == 2
    header, *programs = [json.loads(line) for line in out.read_text().splitlines()]
    assert (header["format"], header["version"], header["programs"]) == ("maitred-trace", 1, 2)
    p = programs[0]
    assert p["program_id"] == "p" and p["agent"] == "planner"
    assert p["steps"][0]["prompt_tokens"] == 500 and p["steps"][0]["completion_tokens"] == 20
    assert p["tool_calls"][0] | {} == {**p["tool_calls"][0], "duration_s": 3.0, "deadline_s": 120.0, "tool": "Bash"}
    assert p["handoffs"][0]["to_agent"] == "coder" and p["handoffs"][0]["context_tokens"] == 520
    assert programs[1]["parent_program_id"] == "p"
    assert store.export_trace(tmp_path / "later.jsonl", since=T0 + 50) == 1


def deeply_nested(levels: int) -> dict:
    root: dict = {}
    node = root
    for _ in range(levels):
        node["x"] = {}
        node = node["x"]
    return root


def test_events_the_database_refuses_are_rejected_alone_and_the_rest_is_stored(store, db_url):
    good = [ToolStart(ts=T0 + i, program_id="p", call_id=f"c{i}", tool="grep") for i in range(10)]
    ends = [ToolEnd(ts=T0 + i + 0.5, program_id="p", call_id=f"c{i}") for i in range(10)]
    bad = [
        LLMEnd(ts=T0, program_id="p", request_id="r1", prompt_tokens=10**20, completion_tokens=1),
        ProgramStart(ts=T0, program_id="q", attrs=deeply_nested(300)),
        ToolStart(ts=T0, program_id="p", call_id="nul", tool="gr\x00ep"),
    ]
    batch = good[:5] + bad + good[5:] + ends
    result = store.write(batch)
    refused = {r.index: r for r in result.rejected}
    assert refused[5].type == "llm.end" and refused[5].reason.startswith("prompt_tokens: out of range for the database")
    assert refused[6].type == "program.start" and refused[6].reason.startswith("attrs: ")
    if db_url.startswith("postgresql"):  # SQLite stores a NUL byte; PostgreSQL text cannot hold one
        assert refused[7].reason.startswith("tool: contains a NUL byte")
    assert result.stored == len(batch) - len(result.rejected)
    assert store.tool_stats("grep").n == 10
    again = store.write(batch)  # a retry of the same batch: same verdicts, nothing twice
    assert (again.stored, again.rejected) == (result.stored, result.rejected)
    with store.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(EventRow)) == result.stored


def test_token_counts_beyond_32_bits_are_stored(store):
    big = 3 * 10**9
    result = store.write(
        [
            LLMEnd(ts=T0, program_id="p", request_id="r", prompt_tokens=big, completion_tokens=big + 1),
            Handoff(ts=T0, program_id="p", from_agent="a", to_agent="b", context_tokens=2**63 - 1),
        ]
    )
    assert (result.stored, result.rejected) == (2, [])
    timeline = store.program("p")
    (span,) = timeline.spans
    assert span.detail["prompt_tokens"] == big and timeline.handoffs[0]["context_tokens"] == 2**63 - 1


def test_a_plain_path_is_a_sqlite_url_and_anything_else_gets_a_hint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalize_db_url("x.db") == f"sqlite:///{tmp_path / 'x.db'}"
    assert normalize_db_url("./data/x.db") == f"sqlite:///{tmp_path / 'data' / 'x.db'}"
    assert normalize_db_url("/abs/x.db") == "sqlite:////abs/x.db"
    assert normalize_db_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_db_url("sqlite:///rel.db") == "sqlite:///rel.db"
    for typed in ("", "mysql://u@h/db", "sqlite:x.db", "postgres:/h/db", str(tmp_path)):
        with pytest.raises(StoreError, match=r"sqlite:///PATH or postgresql\+psycopg://"):
            normalize_db_url(typed)
    with SessionStore("x.db") as store:
        assert store.write(tool_events_objects(1)).stored == 2
    assert (tmp_path / "x.db").exists()


def tool_events_objects(n: int) -> list:
    return [
        e
        for i in range(n)
        for e in (
            ToolStart(ts=T0 + i, program_id="p", call_id=f"c{i}", tool="t"),
            ToolEnd(ts=T0 + i + 1, program_id="p", call_id=f"c{i}"),
        )
    ]


def test_create_false_names_a_missing_database_and_creates_nothing(tmp_path):
    path = tmp_path / "missing.db"
    with pytest.raises(NoSuchDatabase, match=f"no such database: {path}$"):
        SessionStore(str(path), create=False)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with SessionStore(str(path)) as store:
        store.write(tool_events_objects(2))
    with SessionStore(str(path), create=False) as store:
        assert store.tool_stats("t").n == 2


def stamp(url: str, revision: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
    engine.dispose()


def test_a_database_from_a_newer_maitred_is_named_and_stays_readable(db_url):
    with SessionStore(db_url) as store:
        store.write(tool_events_objects(3))
    stamp(db_url, "9f3e1c")
    with pytest.raises(DatabaseTooNew, match=r"^this database was written by a newer maitred \(revision 9f3e1c\)$") as caught:
        SessionStore(db_url)
    assert caught.value.revision == "9f3e1c"
    with SessionStore(db_url, migrate=False) as store:
        assert store.tool_stats("t").n == 3
        assert store.check_integrity() == [f"{store.where}: this database was written by a newer maitred (revision 9f3e1c)"]


def test_a_corrupt_sqlite_file_is_named_not_dumped(tmp_path):
    path = tmp_path / "c.db"
    with SessionStore(str(path)) as store:
        store.write(tool_events_objects(2000))
        assert store.check_integrity() == []
    data = bytearray(path.read_bytes())
    quarter = len(data) // 4
    data[quarter : 3 * quarter] = b"\xa5" * (2 * quarter)  # wreck the middle half of the pages
    path.write_bytes(bytes(data))
    with SessionStore(str(path), migrate=False) as store:
        problems = store.check_integrity()
        assert problems and all(p.startswith(f"{path}: integrity check") for p in problems)
        with pytest.raises(DatabaseCorrupt, match=f"^database is corrupt: {path} "):
            store.events()
    path.write_bytes(b"this is not a database" * 200)
    with pytest.raises(DatabaseCorrupt, match=f"^database is corrupt: {path} \\(file is not a database\\)$"):
        SessionStore(str(path))


def test_check_integrity_finds_nothing_wrong_with_a_fresh_store(store):
    store.write(tool_events_objects(5))
    assert store.check_integrity() == []


def first_revision_tables(url: str, *, keep: set[str] | None = None, rows: bool = False) -> None:
    """What earlier versions left when killed mid-migration: revision 0001's tables (or only
    ``keep`` of them), created statement by statement, with no version stamp."""
    engine = create_engine(url)
    with engine.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        scripts().get_revision("0001").module.upgrade()
        for table in set(inspect(conn).get_table_names()) - (keep or set(Base.metadata.tables)):
            conn.execute(text(f'DROP TABLE "{table}"'))
        if rows:
            body = json.dumps({"type": "program.start", "ts": 1.0, "program_id": "p"})
            conn.execute(
                text("INSERT INTO events (event_key, type, ts, program_id, body) VALUES ('k', 'program.start', 1.0, 'p', :b)"),
                {"b": body},
            )
    engine.dispose()


def test_first_revision_tables_without_a_stamp_are_adopted_with_their_rows(db_url):
    first_revision_tables(db_url, rows=True)
    with SessionStore(db_url) as store:
        assert store.check_integrity() == []
        assert [e["program_id"] for e in store.events()] == ["p"]
        assert store.write(tool_events_objects(1)).stored == 2


def test_empty_leftovers_of_an_interrupted_first_migration_are_rebuilt(db_url):
    first_revision_tables(db_url, keep={"events", "programs"})
    with SessionStore(db_url) as store:
        assert store.check_integrity() == []
        assert store.write(tool_events_objects(3)).stored == 6


def test_unstamped_tables_that_hold_rows_and_do_not_match_are_named_not_touched(db_url):
    first_revision_tables(db_url, keep={"events"}, rows=True)
    with pytest.raises(StoreError, match="without a version stamp .*missing tables handoffs, llm_calls, programs, tool_calls"):
        SessionStore(db_url)
    with SessionStore(db_url, migrate=False) as store:
        assert [e["program_id"] for e in store.events()] == ["p"]


def test_an_event_built_in_process_with_a_wrong_type_is_rejected_naming_the_field(tmp_path):
    # sqlite3 cannot bind a list (psycopg would send it as an array, which PostgreSQL casts to text)
    wrong = ToolStart(ts=T0, program_id="p", call_id="c-x", tool=["grep"])  # type: ignore[arg-type]
    with SessionStore(str(tmp_path / "s.db")) as store:
        result = store.write([*tool_events_objects(2), wrong])
        assert result.stored == 4 and store.tool_stats("t").n == 2
    (rejected,) = result.rejected
    assert (rejected.index, rejected.type) == (4, "tool.start") and rejected.reason.startswith("tool: ")


def test_an_event_a_constraint_refuses_is_isolated_with_the_database_reason(db_url):
    with SessionStore(db_url) as store:
        with store.engine.begin() as conn:
            if db_url.startswith("postgresql"):
                conn.execute(text("ALTER TABLE tool_calls ADD CONSTRAINT no_poison CHECK (tool <> 'poison')"))
            else:
                conn.execute(
                    text(
                        "CREATE TRIGGER no_poison BEFORE INSERT ON tool_calls WHEN NEW.tool = 'poison' "
                        "BEGIN SELECT RAISE(ABORT, 'no poison'); END"
                    )
                )
        poison = ToolStart(ts=T0, program_id="p", call_id="bad", tool="poison")
        result = store.write([*tool_events_objects(3), poison, *tool_events_objects(5)[6:]])
        assert result.stored == 10 and store.tool_stats("t").n == 5
        (rejected,) = result.rejected
        assert (rejected.index, rejected.type) == (6, "tool.start")
        assert rejected.reason in ('new row for relation "tool_calls" violates check constraint "no_poison"', "no poison")


def test_a_missing_postgresql_database_is_named(db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("PostgreSQL only: a missing SQLite file is covered by create=False")
    missing = make_url(db_url).set(database=f"no_such_{uuid.uuid4().hex[:8]}", query={})
    url = missing.render_as_string(hide_password=False)
    with pytest.raises(NoSuchDatabase, match=f"^no such database: {re.escape(missing.render_as_string())}$"):
        SessionStore(url, create=False)


def test_a_tool_end_stamped_before_its_start_moves_the_start_back_by_its_duration(store):
    """Hook processes race: a fast call's end can be stamped before its start. The end's
    duration is the agent's own measure, so the start is placed by it, in one batch or two."""
    store.write([ToolEnd(ts=100.0, program_id="p", call_id="fast", status="ok", duration_s=0.004)])
    store.write([ToolStart(ts=100.05, program_id="p", call_id="fast", tool="Read")])
    store.write(
        [
            ToolEnd(ts=200.0, program_id="p", call_id="nodur", status="ok"),
            ToolStart(ts=200.5, program_id="p", call_id="nodur", tool="Read"),
            ToolStart(ts=300.0, program_id="p", call_id="normal", tool="Bash"),
            ToolEnd(ts=301.0, program_id="p", call_id="normal", status="ok", duration_s=0.9),
        ]
    )
    timeline = store.program("p")
    spans = {s.detail["call_id"]: (s.start, s.end) for s in timeline.spans if s.kind == "tool"}
    assert spans["fast"] == (100.0 - 0.004, 100.0)
    assert spans["nodur"] == (200.0, 200.0)
    assert spans["normal"] == (300.0, 301.0)  # a start before the end less the duration stays
