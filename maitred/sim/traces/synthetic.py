"""A synthetic agent workload calibrated to published Claude Code statistics (MORI's trace study).

Targets (SPEC section 9): tool durations p50 1.1 s, p90 2.0 s, p99 20 s, p99.95 84 s; 87% of calls
under 2 s while the rest take 58% of tool time; busy phases (runs of short calls between long
ones) of median 20 s and p90 81 s at a nominal model step of ``NOMINAL_STEP_S``; context growing
every step.

Programs are generated as MORI describes them: alternating busy phases (model steps separated by
short calls) and idle phases (one long call). A busy phase's length is drawn first, log-normal
with median 20 s; its number of steps follows at the nominal step time. Calls are then:

- short (under 2 s): a log-normal truncated below 2 s, median chosen so that the overall median
  is 1.1 s;
- long (one per phase): 3 in 13 just over the line (uniform on [2, 2.1) s, which puts the overall
  p90 at about 2.0 s), the rest 2 s plus a log-normal with P(> 18 s) = 10% and P(> 82 s) = 0.5%,
  which put the overall p99 at 20 s and p99.95 at 84 s.

The published figures pull against each other a little (a busy-phase p90 of 81 s implies fewer
long calls than 13%); σ = 1.1 for the busy phase is the compromise, and ``test_synthetic`` states
how close each target comes.

``test_synthetic`` checks the generated statistics against the targets. Options add multi-agent
handoffs (a planner hands over to a coder, sharing part of its context), human waits,
subagents and a scale on time in tools:

- ``subagents``: the share of idle phases that end in a call of Claude Code's Agent tool
  (``Task``) instead of a long tool call: the parent waits while a subagent runs (MORI's trace
  study, Figure 4: "a parent agent waiting on a subagent is itself idle"). The subagent's run
  is drawn as 5–20 steps at the nominal step time with short calls between them. Only the
  parent is replayed: the subagent's own model calls are not (their load on the engine is
  missing, which flatters every policy equally).
- ``tool_scale``: every tool duration (and subagent wait) times this; the programs are
  otherwise the same draws, so ``tool_scale=4`` is the same workload with 4× the idle time.
"""

import math
import random
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qsl

from maitred.sim.traces.records import ProgramTrace, Step, ToolCall, Trace, TraceError

NOMINAL_STEP_S = 3.0
SHORT_MU, SHORT_SIGMA = 0.0808, 0.5
LONG_MU, LONG_SIGMA = 1.388, 1.172
BUSY_MEDIAN_S, BUSY_SIGMA = 20.0, 1.1
SHORT_MEAN_S = 1.0  # mean of the truncated short-call distribution
PREFIX = {"claude-code": 9_000, "planner": 6_000, "coder": 7_000}
TOOLS_SHORT = (("Read", None), ("Grep", None), ("Edit", None), ("Bash", "Bash:ls"), ("Bash", "Bash:git"))
TOOLS_LONG = (("Bash", "Bash:pytest"), ("Bash", "Bash:make"), ("WebFetch", None), ("Task", None))


#: Bounds that keep a mistyped option from generating for hours (the published figures use 400).
MAX_PROGRAMS, MAX_STEPS = 100_000, 10_000


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    programs: int = 200
    seed: int = 0
    min_steps: int = 20
    max_steps: int = 70
    handoffs: float = 0.0  # share of programs in which a planner hands off to a coder
    human_waits: float = 0.0  # share of programs that wait once on a person
    deadlines: float = 0.5  # share of tool calls that declare a deadline (Bash's timeout)
    subagents: float = 0.0  # share of idle phases spent waiting on a subagent (Agent tool)
    tool_scale: float = 1.0  # every tool duration times this
    context_scale: float = 1.0  # every program's own context (its start and each step's growth) times this

    def __post_init__(self) -> None:
        if not (1 <= self.programs <= MAX_PROGRAMS and 1 <= self.min_steps <= self.max_steps <= MAX_STEPS):
            raise ValueError(f"programs must be in [1, {MAX_PROGRAMS:,}] and 1 <= min_steps <= max_steps <= {MAX_STEPS:,}")
        for name in ("handoffs", "human_waits", "deadlines", "subagents"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a share in [0, 1]")
        if not 0 < self.tool_scale <= 100:
            raise ValueError("tool_scale must be in (0, 100]")
        if not 0 < self.context_scale <= 100:
            raise ValueError("context_scale must be in (0, 100]")


def short_duration(rng: random.Random) -> float:
    while True:
        d = math.exp(rng.gauss(SHORT_MU, SHORT_SIGMA))
        if d < 2.0:
            return d


def long_duration(rng: random.Random) -> float:
    """A call that ends a busy phase: 3 in 13 just over 2 s, the rest from the heavy tail."""
    if rng.random() < 3 / 13:
        return rng.uniform(2.0, 2.1)
    return min(2.0 + math.exp(rng.gauss(LONG_MU, LONG_SIGMA)), 1_800.0)


def phase_tools(rng: random.Random) -> list[float]:
    """One busy phase and the idle phase that ends it: short calls, then one long call. The
    phase's length at the nominal step is log-normal with median 20 s (σ = 1.1)."""
    busy_s = math.exp(rng.gauss(math.log(BUSY_MEDIAN_S), BUSY_SIGMA))
    steps = max(1, round((busy_s + SHORT_MEAN_S) / (NOMINAL_STEP_S + SHORT_MEAN_S)))
    return [short_duration(rng) for _ in range(steps - 1)] + [long_duration(rng)]


SUBAGENT = -1.0  # marks an idle phase that waits on a subagent (its duration is drawn later)


def subagent_duration(rng: random.Random) -> float:
    """A subagent's run, as its parent waits for it: 5–20 steps at the nominal step time with
    short calls between them."""
    steps = rng.randint(5, 20)
    return steps * NOMINAL_STEP_S + sum(short_duration(rng) for _ in range(steps - 1))


def _tool(rng: random.Random, duration: float, spec: SyntheticSpec) -> ToolCall:
    if duration == SUBAGENT:
        return ToolCall("Task", subagent_duration(rng) * spec.tool_scale, None, "Task:subagent")
    name, signature = rng.choice(TOOLS_LONG if duration >= 2.0 else TOOLS_SHORT)
    deadline = None
    if name == "Bash" and rng.random() < spec.deadlines:
        deadline = max(120.0, duration * rng.uniform(1.5, 4.0))  # declared timeouts are generous
    return ToolCall(name, duration * spec.tool_scale, deadline * spec.tool_scale if deadline else None, signature)


def _program(index: int, rng: random.Random, spec: SyntheticSpec) -> ProgramTrace:
    n_steps = rng.randint(spec.min_steps, spec.max_steps)
    durations: list[float] = []
    while len(durations) < n_steps - 1:
        phase = phase_tools(rng)
        if spec.subagents and rng.random() < spec.subagents:
            phase[-1] = SUBAGENT
        durations.extend(phase)
    multi = rng.random() < spec.handoffs
    agent = "planner" if multi else "claude-code"
    handoff_at = rng.randint(3, max(3, n_steps // 3)) if multi else None
    wait_at = rng.randrange(n_steps) if rng.random() < spec.human_waits else None
    context = PREFIX[agent] + int(rng.randint(500, 3_000) * spec.context_scale)
    steps = []
    for i in range(n_steps):
        handoff_tokens = None
        if i == handoff_at:
            agent = "coder"
            shared = int((context - PREFIX["planner"]) * rng.uniform(0.3, 0.7))
            context = PREFIX["coder"] + shared
            handoff_tokens = context
        output = int(min(max(math.exp(rng.gauss(math.log(120), 0.8)), 10), 2_000))
        tools = (_tool(rng, durations[i], spec),) if i < n_steps - 1 else ()
        wait = math.exp(rng.gauss(math.log(30), 1.0)) if i == wait_at else 0.0
        steps.append(Step(agent, context, output, tools, wait, handoff_tokens))
        context += output + int(min(max(math.exp(rng.gauss(math.log(500), 1.0)), 20), 20_000) * spec.context_scale)
    return ProgramTrace(f"synthetic-{index}", tuple(steps))


def generate(spec: SyntheticSpec | None = None) -> Trace:
    spec = spec or SyntheticSpec()
    rng = random.Random(spec.seed)
    programs = [_program(i, rng, spec) for i in range(spec.programs)]
    return Trace(f"synthetic:claude-code(seed={spec.seed})", programs, dict(PREFIX))


def from_spec(text: str) -> Trace:
    """``synthetic``, ``synthetic:claude-code`` or ``synthetic:claude-code?programs=300&handoffs=0.3``."""
    kind, _, query = text.partition("?")
    if kind not in ("synthetic", "synthetic:claude-code"):
        raise TraceError(f"unknown synthetic workload {kind!r}; use synthetic:claude-code")
    known = {f.name: f.type for f in fields(SyntheticSpec)}
    values: dict[str, Any] = {}  # each converted to its field's type below
    for key, raw in parse_qsl(query, strict_parsing=bool(query)):
        if key not in known:
            raise TraceError(f"synthetic option {key!r} is unknown; options: {', '.join(known)}")
        try:
            values[key] = int(raw) if known[key] in (int, "int") else float(raw)
        except ValueError:
            raise TraceError(f"synthetic option {key}: {raw!r} is not a number") from None
    try:
        return generate(SyntheticSpec(**values))
    except ValueError as exc:
        raise TraceError(f"synthetic options: {exc}") from None
