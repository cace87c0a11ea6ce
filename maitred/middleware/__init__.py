"""In-process instrumentation: scopes, tool calls, handoffs and the emitter that ships them."""

from maitred.middleware.config import configure, emit, flush, shutdown, stats
from maitred.middleware.emitter import Emitter, EmitterSettings, EmitterStats
from maitred.middleware.handoff import handoff
from maitred.middleware.llm import llm_call
from maitred.middleware.otlp import OtlpSink
from maitred.middleware.program import agent, program
from maitred.middleware.sinks import HttpSink, PermanentSinkError, Sink, StoreSink
from maitred.middleware.tool import ToolCall, tool, tool_call

__all__ = [
    "Emitter",
    "EmitterSettings",
    "EmitterStats",
    "HttpSink",
    "OtlpSink",
    "PermanentSinkError",
    "Sink",
    "StoreSink",
    "ToolCall",
    "agent",
    "configure",
    "emit",
    "flush",
    "handoff",
    "llm_call",
    "program",
    "shutdown",
    "stats",
    "tool",
    "tool_call",
]
