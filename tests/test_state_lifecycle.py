"""A program's end is final for the events that describe its past: late news never brings it
back (it would be placed and hold GPU room), a later start is a new life."""

from maitred.events import LLMEnd, LLMStart, ProgramEnd, ProgramStart, ToolEnd, ToolStart
from maitred.runtime import RuntimeState, WorkerState


def ended_program() -> RuntimeState:
    state = RuntimeState([WorkerState("w0", gpu_tokens=100_000, cpu_tokens=200_000)])
    state.apply(ProgramStart(ts=10.0, program_id="p"))
    state.apply(LLMStart(ts=10.0, program_id="p", request_id="r1", prompt_tokens=5_000))
    state.apply(ProgramEnd(ts=12.0, program_id="p", status="ok"))
    assert "p" not in state.programs
    return state


def test_a_late_llm_end_does_not_bring_an_ended_program_back() -> None:
    state = ended_program()
    state.apply(LLMEnd(ts=11.5, program_id="p", request_id="r1", prompt_tokens=5_000, completion_tokens=80, worker="w0"))
    state.apply(ToolStart(ts=11.9, program_id="p", call_id="c", tool="grep"))
    assert "p" not in state.programs


def test_a_late_tool_end_still_teaches_the_history() -> None:
    state = RuntimeState([WorkerState("w0", gpu_tokens=100_000, cpu_tokens=200_000)])
    state.apply(LLMStart(ts=10.0, program_id="p", request_id="r1", prompt_tokens=5_000))
    state.apply(ToolStart(ts=9.0, program_id="p", call_id="c", tool="grep"))  # arrived after the next step began
    state.apply(ProgramEnd(ts=12.0, program_id="p", status="ok"))
    state.apply(ToolEnd(ts=9.5, program_id="p", call_id="c", status="ok"))
    assert "p" not in state.programs
    assert state.history.by_tool["grep"].n == 1


def test_a_start_after_the_end_is_a_new_life() -> None:
    state = ended_program()
    state.apply(LLMStart(ts=30.0, program_id="p", request_id="r2", prompt_tokens=6_000))
    assert state.programs["p"].context_tokens == 6_000
    state.apply(ProgramEnd(ts=31.0, program_id="p", status="ok"))
    state.apply(LLMEnd(ts=30.5, program_id="p", request_id="r2", prompt_tokens=6_000, completion_tokens=10, worker="w0"))
    assert "p" not in state.programs


def test_a_tool_end_that_overtook_its_start_closes_the_call() -> None:
    """Claude Code's async hooks run concurrently: a fast tool's PostToolUse can arrive first."""
    state = RuntimeState([WorkerState("w0", gpu_tokens=100_000, cpu_tokens=200_000)])
    state.apply(LLMStart(ts=10.0, program_id="p", request_id="r1", prompt_tokens=5_000))
    state.apply(LLMEnd(ts=11.0, program_id="p", request_id="r1", prompt_tokens=5_000, completion_tokens=50, worker="w0"))
    state.apply(ToolEnd(ts=11.4, program_id="p", call_id="c", status="ok"))
    state.apply(ToolStart(ts=11.1, program_id="p", call_id="c", tool="grep"))
    p = state.programs["p"]
    assert p.tool is None and p.returned
    assert state.history.by_tool["grep"].n == 1 and abs(state.history.by_tool["grep"].mean - 0.3) < 1e-9
