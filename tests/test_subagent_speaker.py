"""Claude Code's subagents send their parent's session id: which program a request is from, and
what a parent that stopped on its background work is doing (``RuntimeState.speaker``, ``_wait``)."""

from maitred.events import (
    BACKGROUND_WAIT,
    LLMEnd,
    LLMStart,
    ProgramEnd,
    ProgramResume,
    ProgramStart,
    ProgramWait,
    ToolEnd,
    ToolStart,
)
from maitred.runtime import RuntimeState, WorkerState
from maitred.runtime.records import Phase


def parent_with_children(*children: str) -> RuntimeState:
    state = RuntimeState([WorkerState("w0", gpu_tokens=100_000)])
    state.apply(ProgramStart(ts=1.0, program_id="s", agent="main"))
    state.apply(LLMStart(ts=1.0, program_id="s", request_id="r1", prompt_tokens=1_000))
    state.apply(LLMEnd(ts=2.0, program_id="s", request_id="r1", prompt_tokens=1_000, completion_tokens=20, worker="w0"))
    for child in children:
        state.apply(ProgramStart(ts=2.1, program_id=child, parent_program_id="s", agent="general-purpose"))
    return state


def test_a_foreground_childs_request_is_the_childs() -> None:
    state = parent_with_children()
    state.apply(ToolStart(ts=2.0, program_id="s", call_id="agent-1", tool="Agent"))
    assert state.speaker("s") == "s"  # no child yet
    state.apply(ProgramStart(ts=2.1, program_id="s/agent-a", parent_program_id="s", agent="general-purpose"))
    assert state.speaker("s") == "s/agent-a"
    state.apply(ProgramEnd(ts=3.0, program_id="s/agent-a", status="ok"))
    state.apply(ToolEnd(ts=3.1, program_id="s", call_id="agent-1", status="ok"))
    assert state.speaker("s") == "s"


def test_two_running_children_are_not_told_apart() -> None:
    state = parent_with_children("s/agent-a", "s/agent-b")
    state.apply(ToolStart(ts=2.2, program_id="s", call_id="agent-1", tool="Agent"))
    assert state.speaker("s") == "s"
    state.apply(ProgramEnd(ts=3.0, program_id="s/agent-b", status="ok"))
    assert state.speaker("s") == "s/agent-a"


def test_a_parent_between_its_own_steps_keeps_its_requests() -> None:
    state = parent_with_children("s/agent-a")  # a background child; the parent goes on working
    assert state.programs["s"].tool is None
    assert state.speaker("s") == "s"


def test_a_parent_that_stopped_on_its_background_child_is_acting_and_the_request_is_the_childs() -> None:
    state = parent_with_children("s/agent-a")
    state.apply(ProgramWait(ts=2.5, program_id="s", reason=BACKGROUND_WAIT))
    parent = state.programs["s"]
    assert (parent.phase, parent.awaiting_background) == (Phase.ACTING, True)
    assert state.speaker("s") == "s/agent-a"
    state.apply(ProgramResume(ts=4.0, program_id="s"))  # the child's task-notification
    assert state.programs["s"].awaiting_background is False
    assert state.speaker("s") == "s"


def test_a_wait_on_a_person_is_still_waiting_human() -> None:
    state = parent_with_children()
    state.apply(ProgramWait(ts=2.5, program_id="s", reason="human"))
    assert state.programs["s"].phase is Phase.WAITING_HUMAN
