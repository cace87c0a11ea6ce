"""The runtime's live signals as span attributes, for ``maitred serve --otlp-endpoint``.

No event carries them: a program's tier and home worker when its model call arrives, and the
return the runtime predicts for a tool call from its statistics (``runtime.signals.predict_end``,
what ``GET /v1/programs/{id}`` shows as ``predicted_tool_end``). ``OtlpSink`` calls this
through ``note`` when the gateway records the start event, on the event loop, right after the
runtime has observed it; the attributes then go with the span to the sink's thread.

A value the runtime does not know is left out rather than guessed: no worker before the
program has a home, and no predicted return while the prediction is only the default (no
statistics yet) — only one made from recorded durations (``maitred.predicted_return_source``:
``signature``, ``tool`` or ``global``, as ``readiness_source`` says) is exported.
"""

from typing import Any

from maitred.events import Event, LLMStart, ToolStart
from maitred.runtime.signals import predict_end
from maitred.runtime.state import RuntimeState

#: The prediction sources backed by recorded durations (``ToolHistory.lookup``).
MEASURED_SOURCES = frozenset({"signature", "tool", "global"})


def span_signals(state: RuntimeState, event: Event, now: float) -> dict[str, Any]:
    """``maitred.tier`` and ``maitred.worker`` for a model call, ``maitred.predicted_return_s``
    (seconds after the tool's start) and its source for a tool call; empty for the rest."""
    p = state.programs.get(event.program_id)
    if p is None:
        return {}
    if isinstance(event, LLMStart):
        attrs: dict[str, Any] = {"maitred.tier": p.tier.value}
        if p.home_worker is not None:
            attrs["maitred.worker"] = p.home_worker
        return attrs
    if isinstance(event, ToolStart) and p.tool is not None and p.tool.call_id == event.call_id:
        end, source, _ = predict_end(p.tool, state.history, now, state.cfg, use_signature=state.use_signature)
        if end is not None and source in MEASURED_SOURCES:
            return {"maitred.predicted_return_s": end - p.tool.started, "maitred.predicted_return_source": source}
    return {}
