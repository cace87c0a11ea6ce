"""maitred: agent-aware serving for LLM agents.

The names here are the public instrumentation API (SPEC section 5)::

    import maitred

    with maitred.program("p-42", agent="planner"):
        ...

    @maitred.tool(timeout=600)
    def run_tests() -> str: ...
"""

from maitred.middleware import (
    EmitterSettings,
    agent,
    configure,
    flush,
    handoff,
    llm_call,
    program,
    shutdown,
    stats,
    tool,
    tool_call,
)

__version__ = "0.1.0"
__all__ = [
    "EmitterSettings", "agent", "configure", "flush", "handoff", "llm_call", "program", "shutdown",
    "stats", "tool", "tool_call",
]
