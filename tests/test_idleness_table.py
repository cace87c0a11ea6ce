"""The snapshot's idleness table gives ``signals.idleness`` exactly, bit for bit."""

from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from maitred.events import LLMStart, ToolEnd, ToolStart
from maitred.runtime import Phase, ProgramState, SignalConfig
from maitred.runtime.idleness_table import IdlenessTable
from maitred.runtime.signals import idleness
from tests.runtime_helpers import NOW, program, state

seconds = st.floats(min_value=0.0, max_value=1e5, allow_nan=False)


@st.composite
def programs(draw: st.DrawFn, pid: str) -> ProgramState:
    p = ProgramState(
        pid,
        phase=draw(st.sampled_from(list(Phase))),
        phase_since=NOW + draw(st.floats(-1e4, 1e4)),
        open_reason_s=draw(seconds),
        open_act_s=draw(seconds),
    )
    p.cycles = deque(draw(st.lists(st.tuples(seconds, seconds), max_size=20)), maxlen=16)
    return p


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=30), st.data())
def test_table_matches_idleness_through_puts_and_drops(cycles: int, ops: list[tuple[bool, int]], data: st.DataObject) -> None:
    table, live = IdlenessTable(cycles), dict[str, ProgramState]()
    for put, n in ops:  # rows are rewritten, freed and reused
        pid = f"p{n}"
        if put:
            live[pid] = data.draw(programs(pid))
            table.put(live[pid])
        else:
            live.pop(pid, None)
            table.drop(pid)
    inputs = table.inputs()
    assert inputs.slots.keys() == live.keys()
    for now in (NOW, NOW + data.draw(st.floats(-2e4, 2e4))):
        values = inputs.at(now)
        assert [values[inputs.slots[pid]] for pid in live] == [idleness(p, now, cycles) for p in live.values()]


def test_a_snapshots_view_has_the_idleness_of_its_programs_as_the_live_view_does():
    st_ = state(
        [("w0", 10_000, 0)], [program(f"p{i}", cycles=[(1.0 + i, 2.5)] * i) for i in range(20)], SignalConfig(idleness_cycles=3)
    )
    first = st_.snapshot()
    st_.apply(LLMStart(ts=NOW + 3, program_id="p4", request_id="r", prompt_tokens=100))
    st_.apply(ToolStart(ts=NOW + 4, program_id="p9", call_id="c", tool="grep"))
    st_.apply(ToolEnd(ts=NOW + 5, program_id="p9", call_id="c"))
    second, later = st_.snapshot(), NOW + 7
    assert all(first.view(later).signals[pid].idleness == idleness(p, later, 3) for pid, p in first.programs.items())
    live = st_.view(later).signals
    assert {pid: s.idleness for pid, s in second.view(later).signals.items()} == {pid: s.idleness for pid, s in live.items()}
