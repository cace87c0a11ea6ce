"""Perfetto timelines: ``maitred timeline ID --perfetto`` on a stored program family and
``maitred bench replay --perfetto DIR`` on a real replay, each file checked against the Trace
Event Format's rules (``assert_valid_trace``)."""

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from maitred.cli import main
from maitred.events import decode_batch
from maitred.sim.bench import perfetto_path
from maitred.sim.replay import Replay, RunConfig
from maitred.sim.replay_spans import ReplaySpans
from maitred.sim.traces import load_trace
from maitred.storage import SessionStore
from tests.test_store import T0, tool_events

PHASES = {"M", "X", "i", "s", "f"}


def assert_valid_trace(path: Path) -> dict[str, Any]:
    """The rules the Perfetto UI's JSON importer relies on; returns the document."""
    doc = json.loads(path.read_text())  # strict JSON: no NaN, no trailing comma
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[int, dict[str, dict]] = defaultdict(dict)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            continue
        assert e["pid"] in processes, f"pid {e['pid']} has no process_name"
        assert (e["pid"], e["tid"]) in threads, f"tid {e['tid']} has no thread_name"
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            slices[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "i":
            assert e["s"] in ("t", "p", "g"), e
        else:
            assert e["ph"] not in flows[e["id"]], f"flow {e['id']} has two {e['ph']} events"
            flows[e["id"]][e["ph"]] = e
    for thread, spans in slices.items():  # slices on one thread nest
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-3:  # µs rounded to 3 decimals
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, f"slices overlap without nesting on {threads[thread]!r}"
            stack.append(end)
    for flow_id, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {flow_id} is not an s/f pair"
        assert pair["f"]["ts"] >= pair["s"]["ts"] and pair["f"]["bp"] == "e"
        for point in pair.values():  # each end binds to a slice enclosing it on its thread
            assert any(a <= point["ts"] <= b for a, b in slices[point["pid"], point["tid"]]), point
    doc["_threads"] = threads
    return doc


@pytest.fixture
def family(db_url):
    """p-1 (planner): a model call, two tools at once, a wait on a human, a handoff to the child
    p-1/coder; the child runs a tool and has a grandchild known only by its parent id."""
    raw = [
        {"type": "program.start", "ts": T0, "program_id": "p-1", "agent": "planner"},
        {"type": "llm.start", "ts": T0, "program_id": "p-1", "agent": "planner", "request_id": "r1", "model": "qwen-7b"},
        {"type": "llm.end", "ts": T0 + 1, "program_id": "p-1", "request_id": "r1", "prompt_tokens": 2100}
        | {"completion_tokens": 96, "cached_tokens": 2000, "worker": "http://127.0.0.1:30000"},
        {"type": "tool.start", "ts": T0 + 1, "program_id": "p-1", "call_id": "a", "tool": "grep"},
        {"type": "tool.start", "ts": T0 + 1.5, "program_id": "p-1", "call_id": "b", "tool": "pytest", "deadline_s": 60},
        {"type": "tool.end", "ts": T0 + 2, "program_id": "p-1", "call_id": "a"},
        {"type": "tool.end", "ts": T0 + 2.75, "program_id": "p-1", "call_id": "b", "status": "error"},
        {"type": "program.wait", "ts": T0 + 3, "program_id": "p-1"},
        {"type": "program.resume", "ts": T0 + 4, "program_id": "p-1"},
        {"type": "handoff", "ts": T0 + 4.5, "program_id": "p-1", "from_agent": "planner", "to_agent": "coder"}
        | {"child_program_id": "p-1/coder", "context_tokens": 800},
        {"type": "program.start", "ts": T0 + 5, "program_id": "p-1/coder", "agent": "coder", "parent_program_id": "p-1"},
        *tool_events("p-1/coder", "Bash", [0.25], start=T0 + 5, agent="coder"),
        {"type": "program.start", "ts": T0 + 6, "program_id": "p-1/coder/x", "agent": "x", "parent_program_id": "p-1/coder"},
        *tool_events("p-1/coder/x", "read", [0.5], start=T0 + 6, agent="x"),
        {"type": "program.start", "ts": T0, "program_id": "other", "agent": "z"},
    ]
    with SessionStore(db_url) as store:
        assert store.write(decode_batch(raw, now=T0 + 10).events).stored == len(raw)
    return db_url


def test_stored_program_and_its_children_open_as_one_process_with_a_track_each(family, tmp_path, capsys):
    out = tmp_path / "p1.json"
    assert main(["timeline", "p-1", "--db", family, "--perfetto", str(out)]) == 0
    assert "wrote" in capsys.readouterr().err
    doc = assert_valid_trace(out)
    events, threads = doc["traceEvents"], doc["_threads"]
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"program p-1"}
    names = list(threads.values())
    assert names[0] == "p-1 (planner)" and any("p-1/coder (coder)" in n for n in names)
    assert any("p-1/coder/x (x)" in n for n in names) and not any("other" in n for n in names)
    by_name = {e["name"]: e for e in events if e["ph"] == "X"}
    model = by_name["qwen-7b"]
    assert model["ts"] == 0 and model["dur"] == pytest.approx(1e6)  # microseconds from the first record
    assert (
        model["args"].items() >= {"prompt_tokens": 2100, "cached_tokens": 2000, "completion_tokens": 96, "status": "ok"}.items()
    )
    assert model["args"]["worker"] == "http://127.0.0.1:30000"
    assert by_name["pytest"]["args"]["status"] == "error" and by_name["pytest"]["args"]["deadline_s"] == 60
    assert by_name["pytest"]["dur"] == pytest.approx(1.25e6) and by_name["Bash"]["dur"] == pytest.approx(0.25e6)
    assert by_name["grep"]["tid"] != by_name["pytest"]["tid"]  # overlapping tools: two lanes of p-1
    assert threads[1, by_name["pytest"]["tid"]].startswith("p-1 (planner)")
    assert by_name["human"]["cat"] == "wait" and by_name["human"]["dur"] == pytest.approx(1e6)
    flows = [e for e in events if e["ph"] in "sf"]
    thread_of = {(e["ph"], e["id"]): threads[e["pid"], e["tid"]] for e in flows}
    assert {e["name"] for e in flows} == {"handoff planner → coder", "child p-1/coder/x"}
    handoff = next(e["id"] for e in flows if e["name"].startswith("handoff"))
    assert thread_of["s", handoff] == "p-1 (planner)" and "p-1/coder (coder)" in thread_of["f", handoff]


def test_unknown_program_is_one_line_and_writes_no_file(family, tmp_path, capsys):
    out = tmp_path / "none.json"
    assert main(["timeline", "nope", "--db", family, "--perfetto", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("maitred: error: no program 'nope' in")
    assert not out.exists()


def test_unwritable_perfetto_path_names_the_flag(family, tmp_path, capsys):
    out = tmp_path / "missing-folder" / "t.json"
    assert main(["timeline", "p-1", "--db", family, "--perfetto", str(out)]) == 1
    assert capsys.readouterr().err.startswith(f"maitred: error: --perfetto {out}: cannot write")


def test_a_ten_thousand_event_program_is_written_whole(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'big.db'}"
    raw = [{"type": "program.start", "ts": T0, "program_id": "big", "agent": "a"}]
    raw += tool_events("big", "t", [0.001] * 5000, start=T0)
    with SessionStore(url) as store:
        batch = decode_batch(raw, now=T0 + 10**5)
        assert store.write(batch.events).stored == len(raw) == 10_001
    out = tmp_path / "big.json"
    assert main(["timeline", "big", "--db", url, "--perfetto", str(out)]) == 0
    doc = assert_valid_trace(out)
    assert Counter(e["ph"] for e in doc["traceEvents"])["X"] == 5000


def test_replay_writes_one_valid_timeline_per_run_with_tier_moves_and_handoffs(tmp_path, capsys):
    trace = "synthetic:claude-code?programs=12&handoffs=0.5"
    out, timelines = tmp_path / "out", tmp_path / "timelines"
    argv = ["bench", "replay", "--trace", trace, "--policy", "maitred,mori", "--concurrency", "12", "--cpu-ratio", "1"]
    argv += ["--duration", "300", "--gpu-tokens", "100000", "--jobs", "1", "--out", str(out), "--perfetto", str(timelines)]
    assert main(argv) == 0
    files = sorted(p.name for p in timelines.iterdir())
    assert files == ["maitred-c12-x1.perfetto.json", "mori-c12-x1.perfetto.json", "unlimited-c12-x1.perfetto.json"]
    runs = {r["policy"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    for name in files:
        doc = assert_valid_trace(timelines / name)
        events = doc["traceEvents"]
        policy = name.split("-")[0]
        assert doc["otherData"]["policy"] == policy and doc["otherData"]["records_left_out"] == 0
        model_calls = [e for e in events if e["ph"] == "X" and e["cat"] == "model"]
        assert len(model_calls) > 12 and all(e["args"]["worker"] == "w0" for e in model_calls)
        assert all(e["args"]["prompt_tokens"] >= e["args"]["cached_tokens"] >= 0 for e in model_calls)
        moves = [e for e in events if e["ph"] == "i" and e["cat"] == "tier" and e["name"].startswith("→")]
        assert len(moves) == runs[policy]["tier_moves"]  # every move the run counted is on the timeline
        assert [e for e in events if e["ph"] == "s"], "a trace with handoffs has flows"
    assert runs["mori"]["tier_moves"] > 0


def test_replay_timeline_is_bounded_and_says_how_much_it_left_out(tmp_path):
    trace = load_trace("synthetic:claude-code?programs=12")
    replay = Replay(trace, RunConfig("maitred", 8, 1.0, duration_s=200, journal=True))
    replay.spans = ReplaySpans(limit=50)
    result = replay.run()
    path = tmp_path / "run.json"
    replay.spans.write(path, replay.core.journal, {"policy": "maitred"})
    doc = assert_valid_trace(path)
    kept = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("model", "tool")]
    assert len(kept) <= 50 and doc["otherData"]["records_left_out"] > 0
    assert len(kept) + doc["otherData"]["records_left_out"] >= result.requests - 8  # the last ones may be unfinished


def test_perfetto_path_names_the_run():
    cfg = RunConfig("tao", 20, 2.0)
    assert perfetto_path(Path("d"), cfg, False) == Path("d/tao-c20-x2.perfetto.json")
    assert perfetto_path(Path("d"), cfg, True) == Path("d/unlimited-c20-x2.perfetto.json")
