"""Traces the simulator replays: the records (``records``), readers for recorded traces
(``readers``) and a synthetic workload (``synthetic``).

The names callers use are re-exported here, so ``from maitred.sim.traces import load_trace``
does not depend on which of the modules a name lives in.
"""

from maitred.sim.traces.readers import MAX_TOKENS, load_trace, read_maitred, read_swe_agent, read_tracelab
from maitred.sim.traces.records import ProgramTrace, Step, ToolCall, Trace, TraceError

__all__ = [
    "MAX_TOKENS",
    "ProgramTrace",
    "Step",
    "ToolCall",
    "Trace",
    "TraceError",
    "load_trace",
    "read_maitred",
    "read_swe_agent",
    "read_tracelab",
]
