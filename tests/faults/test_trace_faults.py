"""Trace readers under bad records: each one is reported with its file, line and field and
skipped alone, the rest of the trace reads exactly as if the bad record had never been there,
and it replays; results.json stays strict JSON whatever a run produced."""

import json
import math
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from maitred.cli import main
from maitred.sim.profile import EngineProfile
from maitred.sim.replay import RunConfig, run_one
from maitred.sim.traces import MAX_TOKENS, load_trace

SWE = Path(__file__).parents[1] / "data" / "swe-agent-glm45-subset"
NAN, INF = math.nan, math.inf


def _strict(text: str) -> object:
    """json.loads that refuses NaN and Infinity, as strict parsers (JavaScript, Go, jq) do."""

    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def _replays(trace) -> None:
    result = run_one(trace, RunConfig("maitred", 4, duration_s=300, gpu_tokens=200_000), EngineProfile())
    assert result.requests > 0 and math.isfinite(result.ttft_mean_s) and 0 < result.ttft_mean_s < 5


# -- maitred export format ------------------------------------------------------------------------


def _program(pid: str, steps: int = 4) -> dict:
    t, out = 1e9, {"program_id": pid, "agent": "coder", "steps": [], "tool_calls": [], "waits": []}
    for i in range(steps):
        out["steps"].append(
            {
                "request_id": f"r{i}",
                "agent": "coder",
                "start": t,
                "end": t + 1,
                "prompt_tokens": 2000 + 800 * i,
                "completion_tokens": 80,
            }
        )
        out["tool_calls"].append({"call_id": f"c{i}", "tool": "Bash", "start": t + 1.5, "duration_s": 2.0, "deadline_s": 30.0})
        t += 5
    out["waits"].append({"start": t - 2, "end": t - 1})
    return out


#: (what is wrong, where it goes in a good program, the reason expected in the report)
MAITRED_FAULTS = [
    (
        "negative duration",
        ("tool_calls", {"tool": "x", "start": 1e9 + 1.6, "duration_s": -5.0}),
        "tool_calls[4].duration_s: must be >= 0",
    ),
    (
        "NaN duration",
        ("tool_calls", {"tool": "x", "start": 1e9 + 1.6, "duration_s": NAN}),
        "tool_calls[4].duration_s: expected a finite number, got nan",
    ),
    (
        "infinite duration",
        ("tool_calls", {"tool": "x", "start": 1e9 + 1.6, "duration_s": INF}),
        "tool_calls[4].duration_s: expected a finite number, got inf",
    ),
    (
        "negative deadline",
        ("tool_calls", {"tool": "x", "start": 1e9 + 1.6, "duration_s": 1.0, "deadline_s": -1}),
        "tool_calls[4].deadline_s: must be >= 0",
    ),
    ("tool entry not an object", ("tool_calls", 42), "tool_calls[4]: expected an object, got int"),
    ("negative prompt", ("steps", {"start": 1e9 + 2, "prompt_tokens": -100}), "steps[4].prompt_tokens: must be >= 0"),
    ("NaN prompt", ("steps", {"start": 1e9 + 2, "prompt_tokens": NAN}), "steps[4].prompt_tokens: expected a finite whole"),
    (
        "negative output",
        ("steps", {"start": 1e9 + 2, "prompt_tokens": 10, "completion_tokens": -1}),
        "steps[4].completion_tokens: must be >= 0",
    ),
    (
        "10^12 tokens",
        ("steps", {"start": 1e9 + 2, "prompt_tokens": 10**12}),
        f"steps[4].prompt_tokens: must be <= {MAX_TOKENS:,}",
    ),
    ("step not an object", ("steps", "oops"), "steps[4]: expected an object, got str"),
    ("wait without start", ("waits", {"end": 1e9 + 3}), "waits[1].start: expected a finite number, got None"),
    ("wait ending before it starts", ("waits", {"start": 1e9 + 3, "end": 1e9 + 2}), "waits[1].end: before start"),
]


def _write_maitred(path: Path, programs: list, extra_lines: tuple[bytes, ...] = ()) -> None:
    lines = [json.dumps({"format": "maitred-trace", "version": 1, "programs": len(programs)}).encode()]
    lines += [json.dumps(p).encode() for p in programs]
    path.write_bytes(b"\n".join([*lines, *extra_lines]) + b"\n")


@pytest.mark.parametrize(("fault", "entry", "reason"), MAITRED_FAULTS, ids=[f for f, _, _ in MAITRED_FAULTS])
def test_a_bad_entry_in_an_exported_program_is_named_and_skipped_alone(fault, entry, reason, tmp_path):
    field, value = entry
    bad = _program("bad")
    bad[field].append(value)
    faulty, clean = tmp_path / "faulty.jsonl", tmp_path / "clean.jsonl"
    _write_maitred(faulty, [_program("a"), bad, _program("c")])
    _write_maitred(clean, [_program("a"), _program("bad"), _program("c")])

    trace = load_trace(faulty)
    (problem,) = trace.skipped
    assert problem.startswith(f"{faulty}:3: {reason}"), problem
    assert problem.endswith("skipped")
    assert trace.programs == load_trace(clean).programs  # nothing else lost or changed
    _replays(trace)


def test_a_non_utf8_line_and_a_broken_program_cost_only_themselves(tmp_path):
    faulty = tmp_path / "faulty.jsonl"
    broken = json.dumps(_program("mojibake")).encode().replace(b"Bash", b"Ba\xffsh", 1)
    _write_maitred(faulty, [_program("a"), {"program_id": "no-list", "steps": "many"}, _program("c")], (broken,))
    column = broken.index(b"\xff") + 1
    trace = load_trace(faulty)
    assert [p.program_id for p in trace.programs] == ["a", "c"]
    assert trace.skipped == [
        f"{faulty}:3: steps: expected a list, got str; program skipped",
        f"{faulty}:5: not UTF-8 (byte 0xff at column {column}); line skipped",
    ]
    _replays(trace)


def test_a_non_utf8_byte_on_the_header_line_is_a_clear_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"format": "maitred-trace", "version": 1, "note": "\xff"}\n')
    with pytest.raises(ValueError, match=f"{path}: line 1 is not a maitred-trace header"):
        load_trace(path)


# -- TraceLab rounds ------------------------------------------------------------------------------


def _round(session: str, i: int, **override) -> dict:
    row = {
        "session_id": session,
        "round": i,
        "input_tokens_total": 1500 + 600 * i,
        "output_tokens": 60,
        "tools": [{"name": "bash", "emitted_at": 10.0 * i, "result_at": 10.0 * i + 1.5}],
    }
    return {**row, **override}


TRACELAB_FAULTS = [
    ("NaN tokens", {"input_tokens_total": NAN}, "input_tokens_total: expected a finite whole number, got nan; round skipped"),
    ("negative output", {"output_tokens": -3}, "output_tokens: must be >= 0, got -3; round skipped"),
    ("10^12 tokens", {"input_tokens_total": 10**12}, f"input_tokens_total: must be <= {MAX_TOKENS:,}"),
    ("tools not a list", {"tools": 7}, "tools: expected a list, got int; round skipped"),
]


@pytest.mark.parametrize(("fault", "override", "reason"), TRACELAB_FAULTS, ids=[f for f, _, _ in TRACELAB_FAULTS])
def test_a_bad_tracelab_round_is_named_and_skipped_alone(fault, override, reason, tmp_path):
    rows = [_round("s", i) for i in range(5)]
    faulty = tmp_path / "rounds.jsonl"
    faulty.write_text("\n".join(json.dumps(r) for r in [*rows[:2], _round("s", 9, **override), *rows[2:]]) + "\n")
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    trace = load_trace(faulty)
    (problem,) = trace.skipped
    assert problem.startswith(f"{faulty}:3: {reason}"), problem
    assert trace.programs == load_trace(clean).programs
    _replays(trace)


@pytest.mark.parametrize(
    ("tool", "reason"),
    [
        ("not a tool", "tools[1]: expected an object, got str; tool call skipped"),
        ({"name": "x", "emitted_at": 5.0, "result_at": NAN}, "tools[1].result_at: expected a finite number, got nan"),
        ({"name": "x", "emitted_at": 5.0, "result_at": INF}, "tools[1].result_at: expected a finite number, got inf"),
    ],
)
def test_a_bad_tracelab_tool_costs_only_that_tool(tool, reason, tmp_path):
    row = _round("s", 0)
    row["tools"].append(tool)
    path = tmp_path / "rounds.jsonl"
    path.write_text(json.dumps(row) + "\n")
    trace = load_trace(path)
    assert trace.skipped == [f"{path}:1: {reason}" + ("" if reason.endswith("skipped") else "; tool call skipped")]
    assert [t.duration_s for t in trace.programs[0].steps[0].tools] == [1.5]


# -- SWE-agent stage timings ----------------------------------------------------------------------


def _bad_swe_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The test subset with one bad record added to one session per kind of fault."""
    root = tmp_path / "swe"
    shutil.copytree(SWE, root)
    sessions = sorted(p for p in root.iterdir() if p.is_dir())
    faults = {}

    def append(path: Path, raw: bytes, reason: str) -> None:
        with path.open("ab") as f:
            f.write(raw + b"\n")
        faults[reason] = f"{path}:{len(path.read_bytes().splitlines())}"

    append(
        sessions[0] / "prefix_cache_metrics.jsonl",
        b'{"step": 900, "input_tokens": NaN, "output_tokens": 5}',
        "input_tokens: expected a finite whole number, got nan; step skipped",
    )
    append(
        sessions[1] / "prefix_cache_metrics.jsonl",
        b'{"step": 900, "input_tokens": 1000000000000, "output_tokens": 5}',
        f"input_tokens: must be <= {MAX_TOKENS:,}, got 1000000000000; step skipped",
    )
    append(
        sessions[2] / "prefix_cache_metrics.jsonl",
        b'{"step": 900, "input_tokens": 50, "output_tokens": -7}',
        "output_tokens: must be >= 0, got -7; step skipped",
    )
    mojibake = b'{"step": 900, "input_tokens": 50, "output_tokens": 7, "x": "\xfe"}'
    column = mojibake.index(b"\xfe") + 1
    append(sessions[3] / "prefix_cache_metrics.jsonl", mojibake, f"not UTF-8 (byte 0xfe at column {column}); line skipped")
    stages = sessions[4] / "stage_timings.jsonl"
    append(
        stages, b'{"stage": "tool_execution", "phase": "enter", "step": 900, "attempt": 1, "timestamp": 2000000000.0}', "unused"
    )
    append(
        stages,
        b'{"stage": "tool_execution", "phase": "exit", "step": 900, "attempt": 1, "timestamp": 1999999990.0}',
        "timestamp: exit 1999999990.0 before its enter 2000000000.0; tool call skipped",
    )
    append(
        sessions[5] / "stage_timings.jsonl",
        b'{"stage": "tool_execution", "phase": "enter", "step": 901, "attempt": 1, "timestamp": Infinity}',
        "timestamp: expected a finite number, got inf; record skipped",
    )
    del faults["unused"]
    return root, faults


def test_bad_swe_agent_records_are_named_and_skipped_alone(tmp_path):
    root, faults = _bad_swe_copy(tmp_path)
    trace = load_trace(root)
    assert sorted(trace.skipped) == sorted(f"{where}: {reason}" for reason, where in faults.items())
    assert trace.programs == load_trace(SWE).programs
    _replays(trace)


# -- the bench command: skipped records on stderr, strict results.json ----------------------------


def test_bench_reports_skipped_records_and_writes_strict_json(tmp_path, capsys):
    root, faults = _bad_swe_copy(tmp_path)
    out = tmp_path / "bench"
    # 1 simulated second: the slots start over 30 s, so no request finishes and the mean TTFT is undefined
    for duration, has_ttft in (("1", False), ("120", True)):
        assert (
            main(
                [
                    "bench",
                    "replay",
                    "--trace",
                    str(root),
                    "--policy",
                    "maitred",
                    "--concurrency",
                    "2",
                    "--cpu-ratio",
                    "1",
                    "--duration",
                    duration,
                    "--jobs",
                    "1",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        err = capsys.readouterr().err.splitlines()
        assert sorted(err) == sorted(f"maitred: skipped: {where}: {reason}" for reason, where in faults.items())
        runs = _strict((out / "results.json").read_text())["runs"]  # type: ignore[index]
        assert [r["ttft_mean_s"] is not None for r in runs] == [has_ttft, has_ttft]
        assert "| maitred |" in (out / "report.md").read_text()


# -- generated workloads and engine profiles refuse impossible numbers ----------------------------


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("synthetic:claude-code?programs=-3", "programs must be in [1, 100,000]"),
        ("synthetic:claude-code?programs=100000000", "programs must be in [1, 100,000]"),
        ("synthetic:claude-code?max_steps=1000000", "max_steps <= 10,000"),
        ("synthetic:claude-code?handoffs=nan", "handoffs must be a share"),
        ("synthetic:claude-code?programs=nan", "programs: 'nan' is not a number"),
    ],
)
def test_synthetic_options_out_of_range_are_refused_by_name(spec, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        load_trace(spec)


@pytest.mark.parametrize("value", ["Infinity", "NaN", "-1", "0"])
def test_an_engine_profile_with_an_impossible_number_is_refused_by_field(value, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(asdict(EngineProfile())).replace('"step_base_s": 0.006', f'"step_base_s": {value}'))
    with pytest.raises(ValueError, match="engine profile step_base_s: must be positive and finite"):
        EngineProfile.load(path)
