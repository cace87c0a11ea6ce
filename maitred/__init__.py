"""maitred: agent-aware serving for LLM agents.

The names here are the public instrumentation API (SPEC section 5)::

    import maitred

    with maitred.program("p-42", agent="planner"):
        ...

    @maitred.tool(timeout=600)
    def run_tests() -> str: ...

They are loaded on first use (PEP 562), not at ``import maitred``: every ``maitred.*`` module
imports this package first, and the Claude Code command hook, which starts a process on every
tool call, must not pay for the middleware's dependencies (httpx, pydantic) it never uses.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # From the defining modules: ``maitred.middleware.program`` is both a module and the function
    # the package re-exports, and mypy may take the package's name for the module.
    from maitred.middleware.config import configure, flush, shutdown, stats
    from maitred.middleware.emitter import EmitterSettings
    from maitred.middleware.handoff import handoff
    from maitred.middleware.llm import llm_call
    from maitred.middleware.program import agent, program
    from maitred.middleware.tool import tool, tool_call

__version__ = "0.1.0"
__all__ = [
    "EmitterSettings",
    "agent",
    "configure",
    "flush",
    "handoff",
    "llm_call",
    "program",
    "shutdown",
    "stats",
    "tool",
    "tool_call",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(import_module("maitred.middleware"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'maitred' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
