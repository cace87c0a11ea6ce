"""What the live runtime believes of a claim made by a client: no more than can be true.

Events and admissions come from clients the gateway does not control, and the state acts on
what they say. Two claims are bounded before they reach it:

- **time**: an event stamped in the future (validation allows ``MAX_FUTURE_SKEW_S`` of clock
  skew) is taken as happening now. A ``program.end`` stamped 299 s ahead would otherwise mark
  its program ended until then, and every request of that id in between would be late news of
  a finished program, never admitted, held for the whole hold bound.
- **tokens**: no request holds more KV than the largest worker's GPU pool (a prompt that does
  not fit is refused by the engine), so token counts above it are taken as that much. Two
  claims of 2**62 prompt tokens would otherwise fill every worker's GPU tier on paper and hold
  every new program, fleet-wide, for the whole hold bound.

The store keeps events as they were sent (history, for the record); only the state's copy is
bounded.
"""

from collections.abc import Iterable, Mapping
from dataclasses import replace

from maitred.events import Event, Handoff, LLMEnd, LLMStart
from maitred.runtime.records import WorkerState

#: The token counts of each event type that the state sizes programs by.
TOKEN_FIELDS: Mapping[type[Event], tuple[str, ...]] = {
    LLMStart: ("prompt_tokens",),
    LLMEnd: ("prompt_tokens", "completion_tokens", "cached_tokens"),
    Handoff: ("context_tokens",),
}


def token_limit(workers: Iterable[WorkerState]) -> int | None:
    """The most tokens one request can hold: the largest GPU pool (None: no worker known yet)."""
    return max((w.gpu_tokens for w in workers), default=0) or None


def clamp_tokens(value: int | None, limit: int | None) -> int | None:
    return value if value is None or limit is None else min(value, limit)


def believable(event: Event, *, now: float, limit: int | None) -> Event:
    """``event`` as the state takes it: not later than ``now``, no count above ``limit``."""
    changes: dict[str, float | int] = {}
    if event.ts > now:
        changes["ts"] = now
    if limit is not None:
        for name in TOKEN_FIELDS.get(type(event), ()):
            value = getattr(event, name)
            if value is not None and value > limit:
                changes[name] = limit
    return replace(event, **changes) if changes else event  # type: ignore[arg-type]
