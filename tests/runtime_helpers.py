"""Builders for policy tests: programs and workers in a given situation, without event plumbing."""

from maitred.runtime import Phase, ProgramState, RuntimeState, SignalConfig, Tier, WorkerState
from maitred.runtime.records import OpenTool, Residency

NOW = 10_000.0


def program(
    pid: str,
    *,
    tokens: int = 1000,
    phase: Phase = Phase.ACTING,
    home: str | None = None,
    tier: Tier = Tier.WAITING,
    cycles: list[tuple[float, float]] | None = None,
    returned: bool = False,
    tool: str | None = "bash",
    tool_started: float = NOW - 1.0,
    agent: str = "coder",
    cached_on: dict[str, tuple[int, float]] | None = None,
) -> ProgramState:
    p = ProgramState(
        pid, agent=agent, phase=phase, phase_since=NOW, context_tokens=tokens, home_worker=home, tier=tier, returned=returned
    )
    if phase is Phase.ACTING and tool is not None and not returned:
        p.tool = OpenTool("call-" + pid, tool, None, tool_started)
    for c in cycles or []:
        p.cycles.append(c)
    for worker, (cached, age) in (cached_on or {}).items():
        p.residency[(worker, None, None, None)] = Residency(cached, NOW - age)
    return p


def state(
    workers: list[tuple[str, int, int]],
    programs: list[ProgramState],
    cfg: SignalConfig | None = None,
    *,
    prompts_held: bool = True,
) -> RuntimeState:
    """``prompts_held``: the driver holds every program's prompts, as the replay does, so any
    warmup a policy proposes can be sent."""
    st = RuntimeState([WorkerState(w, gpu_tokens=g, cpu_tokens=c) for w, g, c in workers], cfg)
    for p in programs:
        st.programs[p.program_id] = p
        if prompts_held:
            st.prompts.last.add(p.program_id)
            st.prompts.handoff.add(p.program_id)
    return st
