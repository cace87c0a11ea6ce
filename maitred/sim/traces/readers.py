"""Readers for three trace formats, and ``load_trace``, which tells them (and synthetic specs) apart.

Readers validate as they go: a malformed record is reported with its file, line and field, and
skipped, never silently dropped and never fatal to the records beside it; a file with no usable
program at all is an error.

Formats:
- ``swe-agent``: a folder of per-instance folders with ``stage_timings.jsonl`` and
  ``prefix_cache_metrics.jsonl`` (the SWE-agent stage-timing format of ``traces/swe-agent-glm45-bs4``).
- ``tracelab``: JSONL, one record per round: ``session_id`` (or ``trace_id`` / ``program_id``),
  ``round``, ``input_tokens_total``, ``newly_append_tokens``, ``output_tokens``, optional
  ``agent`` and ``tools[]`` with ``name``, ``emitted_at`` and ``result_at`` (seconds).
- ``maitred``: the JSONL written by ``maitred export`` (docs/trace-format.md).
"""

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from maitred.events import TRACE_FORMAT, TRACE_VERSION
from maitred.sim.traces.records import ProgramTrace, Step, ToolCall, Trace, TraceError
from maitred.sim.traces.synthetic import from_spec

#: The largest prompt or output a trace may claim. Today's longest context windows are 10M
#: tokens; a count beyond that is a broken record, and replaying it would only stall the run.
MAX_TOKENS = 10_000_000


class _Problems:
    """Collects refusals with where they happened."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def _jsonl(path: Path, problems: _Problems) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file with their line numbers. Lines are decoded one by one,
    so a stray non-UTF-8 byte costs its own line only; an unreadable file is one problem."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        problems.add(str(path), f"cannot read ({exc.strerror or exc})")
        return
    with handle:
        for number, raw in enumerate(handle, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problems.add(where, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); line skipped")
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as exc:
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                problems.add(where, f"invalid JSON ({reason}); line skipped")
                continue
            if not isinstance(record, dict):
                problems.add(where, "expected a JSON object; line skipped")
                continue
            yield number, record


def _number(
    record: dict[str, Any],
    name: str,
    *,
    kind: type = float,
    minimum: float | None = 0,
    maximum: float | None = None,
    at: str = "",
) -> Any:
    """``record[name]`` as a finite number in range; the ValueError names the field (``at`` is
    the path of ``record`` inside its line, e.g. ``steps[3].``)."""
    value = record.get(name)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (kind is int and not float(value).is_integer())
    ):
        raise ValueError(f"{at}{name}: expected a finite {'whole ' if kind is int else ''}number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{at}{name}: must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{at}{name}: must be <= {maximum:,}, got {value!r}")
    return kind(value)


def _tokens(record: dict[str, Any], name: str, at: str = "") -> int:
    return int(_number(record, name, kind=int, maximum=MAX_TOKENS, at=at))


def _optional(record: dict[str, Any], name: str, *, at: str = "", minimum: float | None = 0) -> float | None:
    return None if record.get(name) is None else float(_number(record, name, minimum=minimum, at=at))


def _entries(record: dict[str, Any], name: str) -> list[Any]:
    value = record.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{name}: expected a list, got {type(value).__name__}")
    return value


def _finish(name: str, programs: list[ProgramTrace], prefix: dict[str, int], problems: _Problems) -> Trace:
    if not programs:
        detail = f"; first problem: {problems.items[0]}" if problems.items else ""
        raise TraceError(f"trace {name}: no usable program{detail}")
    return Trace(name, programs, prefix, problems.items)


# -- SWE-agent stage timings ----------------------------------------------------------------------


def read_swe_agent(root: Path) -> Trace:
    problems = _Problems()
    programs: list[ProgramTrace] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        stages, metrics = folder / "stage_timings.jsonl", folder / "prefix_cache_metrics.jsonl"
        if not stages.exists() or not metrics.exists():
            problems.add(str(folder), "missing stage_timings.jsonl or prefix_cache_metrics.jsonl; instance skipped")
            continue
        program = _swe_program(folder.name, stages, metrics, problems)
        if program is not None:
            programs.append(program)
    # The SWE-agent system prompt and tool list are shared by every instance: the smallest
    # first prompt of the trace bounds how much of it is common.
    prefix = {"swe-agent": min(p.steps[0].input_tokens for p in programs)} if programs else {}
    return _finish(str(root), programs, prefix, problems)


def _swe_program(name: str, stages: Path, metrics: Path, problems: _Problems) -> ProgramTrace | None:
    tokens: dict[int, tuple[int, int]] = {}
    for number, record in _jsonl(metrics, problems):
        try:
            tokens[_number(record, "step", kind=int, minimum=1)] = (
                _tokens(record, "input_tokens"),
                _tokens(record, "output_tokens"),
            )
        except ValueError as exc:
            problems.add(f"{metrics}:{number}", f"{exc}; step skipped")
    open_tools: dict[tuple[int, int], float] = {}
    tools: dict[int, list[ToolCall]] = defaultdict(list)
    for number, record in _jsonl(stages, problems):
        if record.get("stage") != "tool_execution":
            continue
        where = f"{stages}:{number}"
        try:
            step = _number(record, "step", kind=int, minimum=1)
            ts = _number(record, "timestamp")
            attempt = _number(record, "attempt", kind=int) if record.get("attempt") is not None else 0
            phase = record.get("phase")
            if phase not in ("enter", "exit"):
                raise ValueError(f"phase: expected 'enter' or 'exit', got {phase!r}")
        except ValueError as exc:
            problems.add(where, f"{exc}; record skipped")
            continue
        if phase == "enter":
            open_tools[(step, attempt)] = ts
        elif (step, attempt) not in open_tools:
            problems.add(where, f"phase: tool_execution exit of step {step} without an enter; tool call skipped")
        elif ts < open_tools[(step, attempt)]:
            problems.add(where, f"timestamp: exit {ts} before its enter {open_tools.pop((step, attempt))}; tool call skipped")
        else:
            tools[step].append(ToolCall("tool", ts - open_tools.pop((step, attempt))))
    if not tokens:
        problems.add(str(metrics), "no usable step; instance skipped")
        return None
    steps = tuple(Step("swe-agent", tokens[s][0], max(tokens[s][1], 1), tuple(tools.get(s, ()))) for s in sorted(tokens))
    return ProgramTrace(name, steps)


# -- TraceLab-style rounds ------------------------------------------------------------------------


def read_tracelab(path: Path) -> Trace:
    problems = _Problems()
    rounds: dict[str, list[tuple[int, Step]]] = defaultdict(list)
    for number, record in _jsonl(path, problems):
        where = f"{path}:{number}"
        pid = record.get("session_id") or record.get("trace_id") or record.get("program_id")
        if not isinstance(pid, str) or not pid:
            problems.add(where, "session_id: missing (also looked for trace_id, program_id); round skipped")
            continue
        try:
            index = _number(record, "round", kind=int) if "round" in record else len(rounds[pid])
            total = _tokens(record, "input_tokens_total")
            if "newly_append_tokens" in record:
                _tokens(record, "newly_append_tokens")
            output = _tokens(record, "output_tokens")
            tools_in = _entries(record, "tools")
        except ValueError as exc:
            problems.add(where, f"{exc}; round skipped")
            continue
        calls = []
        for i, tool in enumerate(tools_in):
            try:
                calls.append(_tracelab_tool(tool, f"tools[{i}]."))
            except ValueError as exc:
                problems.add(where, f"{exc}; tool call skipped")
        agent = record.get("agent") if isinstance(record.get("agent"), str) else "agent"
        rounds[pid].append((index, Step(agent or "agent", total, max(output, 1), tuple(calls))))
    programs = [ProgramTrace(pid, tuple(step for _, step in sorted(steps, key=lambda x: x[0]))) for pid, steps in rounds.items()]
    return _finish(str(path), programs, {}, problems)


def _tracelab_tool(tool: Any, at: str) -> ToolCall:
    if not isinstance(tool, dict):
        raise ValueError(f"{at[:-1]}: expected an object, got {type(tool).__name__}")
    emitted, result = _number(tool, "emitted_at", at=at), _number(tool, "result_at", at=at)
    if result < emitted:
        raise ValueError(f"{at}result_at: before emitted_at")
    return ToolCall(str(tool.get("name") or "tool"), result - emitted)


# -- maitred export -------------------------------------------------------------------------------


def read_maitred(path: Path) -> Trace:
    problems = _Problems()
    programs: list[ProgramTrace] = []
    records = _jsonl(path, problems)
    header = next(records, None)
    if header is None or header[0] != 1 or header[1].get("format") != TRACE_FORMAT:
        raise TraceError(f"{path}: line 1 is not a {TRACE_FORMAT} header")
    if header[1].get("version") != TRACE_VERSION:
        raise TraceError(f"{path}: unsupported {TRACE_FORMAT} version {header[1].get('version')!r}")
    for number, record in records:
        where = f"{path}:{number}"
        try:
            program = _maitred_program(record, partial(problems.add, where))
        except ValueError as exc:
            problems.add(where, f"{exc}; program skipped")
            continue
        if program.steps:
            programs.append(program)
    return _finish(str(path), programs, {}, problems)


@dataclass(frozen=True, slots=True)
class _Timed:
    """One validated entry of an exported program, placed on its timeline."""

    start: float | None
    end: float | None
    value: Any


Report = Callable[[str], None]


def _valid(entries: list[Any], field_name: str, parse: Callable[[dict[str, Any], str], _Timed], report: Report) -> list[_Timed]:
    """The entries ``parse`` accepts; each refusal is reported with its field and skipped alone."""
    kept = []
    for i, entry in enumerate(entries):
        at = f"{field_name}[{i}]."
        try:
            if not isinstance(entry, dict):
                raise ValueError(f"{at[:-1]}: expected an object, got {type(entry).__name__}")
            kept.append(parse(entry, at))
        except ValueError as exc:
            report(f"{exc}; {field_name[:-1].replace('_', ' ')} skipped")
    return kept


def _step_entry(s: dict[str, Any], at: str) -> _Timed:
    prompt = _tokens(s, "prompt_tokens", at)
    output = _tokens(s, "completion_tokens", at) if s.get("completion_tokens") is not None else 1
    agent = s.get("agent") if isinstance(s.get("agent"), str) else None
    return _Timed(_optional(s, "start", at=at), _optional(s, "end", at=at), (agent, prompt, max(output, 1)))


def _tool_entry(t: dict[str, Any], at: str) -> _Timed:
    if t.get("duration_s") is None:
        return _Timed(None, None, None)  # still running when exported: nothing to replay
    duration = float(_number(t, "duration_s", at=at))
    deadline = _optional(t, "deadline_s", at=at)
    signature = t.get("signature") if isinstance(t.get("signature"), str) else None
    return _Timed(_optional(t, "start", at=at), None, ToolCall(str(t.get("tool") or "tool"), duration, deadline, signature))


def _wait_entry(w: dict[str, Any], at: str) -> _Timed:
    start = float(_number(w, "start", at=at))
    end = _optional(w, "end", at=at)
    if end is not None and end < start:
        raise ValueError(f"{at}end: before start")
    return _Timed(start, end, None)


def _maitred_program(record: dict[str, Any], report: Report) -> ProgramTrace:
    pid = record.get("program_id")
    if not isinstance(pid, str) or not pid:
        raise ValueError("program_id: missing")
    steps_in = sorted(_valid(_entries(record, "steps"), "steps", _step_entry, report), key=lambda s: s.start or s.end or 0.0)
    tools_in = [t for t in _valid(_entries(record, "tool_calls"), "tool_calls", _tool_entry, report) if t.value]
    waits = _valid(_entries(record, "waits"), "waits", _wait_entry, report)
    default_agent = record.get("agent") if isinstance(record.get("agent"), str) else None
    steps: list[Step] = []
    previous_agent = None
    for i, s in enumerate(steps_in):
        agent_name, prompt, output = s.value
        start = s.end or s.start or 0.0
        until = (steps_in[i + 1].start or math.inf) if i + 1 < len(steps_in) else math.inf
        calls = tuple(t.value for t in tools_in if start <= (t.start or 0.0) < until)
        wait = sum((w.end or w.start) - w.start for w in waits if w.start is not None and start <= w.start < until)
        agent = agent_name or default_agent or "agent"
        handoff = prompt if previous_agent is not None and agent != previous_agent else None
        steps.append(Step(agent, prompt, output, calls, float(wait), handoff))
        previous_agent = agent
    return ProgramTrace(pid, tuple(steps))


def load_trace(path: str | Path) -> Trace:
    """Read a trace, telling the format from what is there; ``synthetic:...`` specs generate one."""
    text = str(path)
    if text.startswith("synthetic"):
        return from_spec(text)
    p = Path(path)
    try:
        if not p.exists():
            raise TraceError(f"{p}: no such file or folder")
        if p.is_dir():
            return read_swe_agent(p)
        with p.open("rb") as handle:
            first = handle.readline().decode("utf-8", errors="replace")
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror or exc})") from None
    try:
        head = json.loads(first) if first.strip() else {}
    except (json.JSONDecodeError, RecursionError):
        raise TraceError(f"{p}: line 1 is not JSON; expected a maitred or TraceLab JSONL trace") from None
    if isinstance(head, dict) and head.get("format") == TRACE_FORMAT:
        return read_maitred(p)
    return read_tracelab(p)
