"""The common trace model the simulator replays, and readers for three trace formats.

A trace is a list of programs; a program is a list of steps; a step is one model call (its whole
prompt, its output) followed by the tool calls (and optional human wait) before the next step.
Readers validate as they go: a malformed record is reported with its file, line and field, and
skipped, never silently dropped and never fatal to the records beside it; a file with no usable
program at all is an error.

Formats:
- ``swe-agent``: a folder of per-instance folders with ``stage_timings.jsonl`` and
  ``prefix_cache_metrics.jsonl`` (the SWE-agent stage-timing format of ``shared/traces``).
- ``tracelab``: JSONL, one record per round: ``session_id`` (or ``trace_id`` / ``program_id``),
  ``round``, ``input_tokens_total``, ``newly_append_tokens``, ``output_tokens``, optional
  ``agent`` and ``tools[]`` with ``name``, ``emitted_at`` and ``result_at`` (seconds).
- ``maitred``: the JSONL written by ``maitred export`` (docs/trace-format.md).
"""

import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("maitred.sim")


class TraceError(ValueError):
    """A trace that cannot be used at all (no program survived validation, unknown format)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    duration_s: float
    deadline_s: float | None = None
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    agent: str
    input_tokens: int          # the whole prompt of this model call
    output_tokens: int
    tools: tuple[ToolCall, ...] = ()
    human_wait_s: float = 0.0  # after the tools, before the next step
    handoff_tokens: int | None = None  # set on the first step of a new agent: the shared context


@dataclass(frozen=True, slots=True)
class ProgramTrace:
    program_id: str
    steps: tuple[Step, ...]


@dataclass
class Trace:
    name: str
    programs: list[ProgramTrace]
    prefix_tokens: dict[str, int] = field(default_factory=dict)  # each agent's shared system prompt
    skipped: list[str] = field(default_factory=list)               # what validation refused, and why

    def tool_durations(self) -> list[float]:
        return [t.duration_s for p in self.programs for s in p.steps for t in s.tools]


class _Problems:
    """Collects refusals with where they happened; logs a summary instead of one line each."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def _jsonl(path: Path, problems: _Problems) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.add(f"{path}:{number}", f"invalid JSON ({exc.msg})")
                continue
            if not isinstance(record, dict):
                problems.add(f"{path}:{number}", "expected a JSON object")
                continue
            yield number, record


def _number(record: dict[str, Any], name: str, *, kind: type = float, minimum: float = 0) -> Any:
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise ValueError(f"{name}: expected a {'whole ' if kind is int else ''}number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value!r}")
    return kind(value)


def _finish(name: str, programs: list[ProgramTrace], prefix: dict[str, int], problems: _Problems) -> Trace:
    if problems.items:
        log.warning("trace %s: skipped %d malformed records (first: %s)", name, len(problems.items), problems.items[0])
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
            problems.add(str(folder), "missing stage_timings.jsonl or prefix_cache_metrics.jsonl")
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
                _number(record, "input_tokens", kind=int), _number(record, "output_tokens", kind=int))
        except ValueError as exc:
            problems.add(f"{metrics}:{number}", str(exc))
    open_tools: dict[tuple[int, int], float] = {}
    tools: dict[int, list[ToolCall]] = defaultdict(list)
    for number, record in _jsonl(stages, problems):
        if record.get("stage") != "tool_execution":
            continue
        try:
            step = _number(record, "step", kind=int, minimum=1)
            ts = _number(record, "timestamp")
            attempt = int(record.get("attempt") or 0)
            phase = record.get("phase")
            if phase not in ("enter", "exit"):
                raise ValueError(f"phase: expected 'enter' or 'exit', got {phase!r}")
        except ValueError as exc:
            problems.add(f"{stages}:{number}", str(exc))
            continue
        if phase == "enter":
            open_tools[(step, attempt)] = ts
        elif (step, attempt) in open_tools:
            tools[step].append(ToolCall("tool", max(ts - open_tools.pop((step, attempt)), 0.0)))
        else:
            problems.add(f"{stages}:{number}", f"tool_execution exit of step {step} without an enter")
    if not tokens:
        problems.add(str(metrics), "no usable step")
        return None
    steps = tuple(
        Step("swe-agent", tokens[s][0], max(tokens[s][1], 1), tuple(tools.get(s, ())))
        for s in sorted(tokens)
    )
    return ProgramTrace(name, steps)


# -- TraceLab-style rounds ------------------------------------------------------------------------

def read_tracelab(path: Path) -> Trace:
    problems = _Problems()
    rounds: dict[str, list[tuple[int, Step]]] = defaultdict(list)
    for number, record in _jsonl(path, problems):
        where = f"{path}:{number}"
        pid = record.get("session_id") or record.get("trace_id") or record.get("program_id")
        if not isinstance(pid, str) or not pid:
            problems.add(where, "session_id: missing (also looked for trace_id, program_id)")
            continue
        try:
            index = _number(record, "round", kind=int) if "round" in record else len(rounds[pid])
            total = _number(record, "input_tokens_total", kind=int)
            if "newly_append_tokens" in record:
                _number(record, "newly_append_tokens", kind=int)
            output = _number(record, "output_tokens", kind=int)
            calls = []
            for i, tool in enumerate(record.get("tools") or []):
                if not isinstance(tool, dict):
                    raise ValueError(f"tools[{i}]: expected an object")
                emitted, result = _number(tool, "emitted_at"), _number(tool, "result_at")
                if result < emitted:
                    raise ValueError(f"tools[{i}].result_at: before emitted_at")
                calls.append(ToolCall(str(tool.get("name") or "tool"), result - emitted))
        except ValueError as exc:
            problems.add(where, str(exc))
            continue
        agent = record.get("agent") if isinstance(record.get("agent"), str) else "agent"
        rounds[pid].append((index, Step(agent, total, max(output, 1), tuple(calls))))
    programs = [ProgramTrace(pid, tuple(step for _, step in sorted(steps, key=lambda x: x[0]))) for pid, steps in rounds.items()]
    return _finish(str(path), programs, {}, problems)


# -- maitred export -------------------------------------------------------------------------------

def read_maitred(path: Path) -> Trace:
    problems = _Problems()
    programs: list[ProgramTrace] = []
    records = _jsonl(path, problems)
    header = next(records, None)
    if header is None or header[1].get("format") != "maitred-trace":
        raise TraceError(f"{path}: line 1 is not a maitred-trace header")
    if header[1].get("version") != 1:
        raise TraceError(f"{path}: unsupported maitred-trace version {header[1].get('version')!r}")
    for number, record in records:
        try:
            programs.append(_maitred_program(record))
        except (ValueError, TypeError) as exc:
            problems.add(f"{path}:{number}", str(exc))
    return _finish(str(path), [p for p in programs if p.steps], {}, problems)


def _maitred_program(record: dict[str, Any]) -> ProgramTrace:
    pid = record.get("program_id")
    if not isinstance(pid, str) or not pid:
        raise ValueError("program_id: missing")
    steps_in = sorted(record.get("steps") or [], key=lambda s: s.get("start") or s.get("end") or 0)
    tools_in = [t for t in record.get("tool_calls") or [] if t.get("duration_s") is not None]
    waits = record.get("waits") or []
    steps: list[Step] = []
    previous_agent = None
    for i, s in enumerate(steps_in):
        if s.get("prompt_tokens") is None:
            raise ValueError(f"steps[{i}].prompt_tokens: missing")
        start = s.get("end") or s.get("start") or 0.0
        until = (steps_in[i + 1].get("start") or float("inf")) if i + 1 < len(steps_in) else float("inf")
        calls = tuple(
            ToolCall(t.get("tool") or "tool", float(t["duration_s"]), t.get("deadline_s"), t.get("signature"))
            for t in tools_in if start <= (t.get("start") or 0.0) < until
        )
        wait = sum(((w.get("end") or w["start"]) - w["start"]) for w in waits if start <= w["start"] < until)
        agent = s.get("agent") or record.get("agent") or "agent"
        handoff = _number(s, "prompt_tokens", kind=int) if previous_agent is not None and agent != previous_agent else None
        steps.append(Step(agent, _number(s, "prompt_tokens", kind=int), max(int(s.get("completion_tokens") or 1), 1),
                          calls, float(wait), handoff))
        previous_agent = agent
    return ProgramTrace(pid, tuple(steps))


def load_trace(path: str | Path) -> Trace:
    """Read a trace, telling the format from what is there; ``synthetic:...`` specs generate one."""
    text = str(path)
    if text.startswith("synthetic"):
        from maitred.sim.synthetic import from_spec

        return from_spec(text)
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file or folder")
    if p.is_dir():
        return read_swe_agent(p)
    with p.open(encoding="utf-8") as handle:
        first = handle.readline()
    try:
        head = json.loads(first) if first.strip() else {}
    except json.JSONDecodeError:
        raise TraceError(f"{p}: line 1 is not JSON; expected a maitred or TraceLab JSONL trace") from None
    if isinstance(head, dict) and head.get("format") == "maitred-trace":
        return read_maitred(p)
    return read_tracelab(p)
