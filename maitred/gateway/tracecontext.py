"""W3C Trace Context through the gateway: a client's ``traceparent`` and ``tracestate`` go on to
the worker (SGLang started with ``--enable-trace`` reads them from the request headers, in its
tokenizer manager, to join its request spans to the caller's trace), and the trace id
goes on the request's ``llm.start`` and ``llm.end`` (``trace_id``), so a model call in the store
can be found from the agent's trace and back.

Only a ``traceparent`` the W3C format allows is passed on (version ``00`` exactly, or a later
version's first four fields; a trace id and parent id of hex digits, not all zero). An invalid one
is dropped with its ``tracestate``, as the specification asks of a participant that cannot parse
it; the request itself goes on unchanged either way: trace context never decides whether it is
served.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: ``version-traceid-parentid-flags``; versions after 00 may append fields after a dash.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE, _ZERO_PARENT = "0" * 32, "0" * 16


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A caller's trace context: the headers to forward, and the trace id they name."""

    trace_id: str
    headers: Mapping[str, str]


def trace_context(headers: Mapping[str, str]) -> TraceContext | None:
    """The request's trace context, or None when it has no valid ``traceparent``."""
    parent = headers.get(TRACEPARENT)
    if parent is None:
        return None
    found = _TRACEPARENT.fullmatch(parent.strip())
    if found is None:
        return None
    version, trace_id, parent_id, _, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return None
    forwarded = {TRACEPARENT: parent.strip()}
    state = headers.get(TRACESTATE)
    if state:
        forwarded[TRACESTATE] = state
    return TraceContext(trace_id, forwarded)
