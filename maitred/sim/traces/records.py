"""The common trace model the simulator replays: a trace is a list of programs; a program is a
list of steps; a step is one model call (its whole prompt, its output) followed by the tool calls
(and optional human wait) before the next step.

Plain records only, so the readers and the synthetic generator that make traces, and the replay
that consumes them, all import them from here and never each other.
"""

from dataclasses import dataclass, field


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
    input_tokens: int  # the whole prompt of this model call
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
    """A replayable trace. ``skipped`` lists every record the reader refused (``file:line:
    field: reason; what was skipped``): the reader never logs, so the caller decides how to
    report it (the CLI prints it once, not once per worker process)."""

    name: str
    programs: list[ProgramTrace]
    prefix_tokens: dict[str, int] = field(default_factory=dict)  # each agent's shared system prompt
    skipped: list[str] = field(default_factory=list)  # what validation refused, and why

    def tool_durations(self) -> list[float]:
        return [t.duration_s for p in self.programs for s in p.steps for t in s.tools]
