"""Keeping one large request from stalling every other one on the gateway's event loop.

The event loop serves every client: a request that parses a 14 MB event batch on it (over 0.2 s
of JSON parsing and validation) or walks a large prompt freezes ``/healthz`` and every stream
for that long. Bodies over ``INLINE_BYTES`` are parsed in a worker thread instead, and the
events of a large batch reach the runtime in slices of ``SLICE_EVENTS`` with a pass of the loop
between them. A thread helps only where the interpreter can switch: one C call (a JSON parser
over one huge value) holds it throughout, so the parsers are called on pieces
(``loads_batch(whole_limit=...)``), and the longest single value a body may hold is what the body
limits (``--max-body-mb``, ``--max-events-mb``) bound.
"""

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from maitred.events import Event

if TYPE_CHECKING:
    from maitred.gateway.loop import LiveDriver

T = TypeVar("T")

#: Bodies up to this size are parsed on the loop: a thread's round trip costs more than they do.
INLINE_BYTES = 256 << 10
#: Events applied to the runtime between two passes of the loop (about 3 ms of work).
SLICE_EVENTS = 2_000


async def off_loop(parse: Callable[[], T], size: int) -> T:
    """``parse()``, in a worker thread when the body it parses is larger than ``INLINE_BYTES``."""
    if size <= INLINE_BYTES:
        return parse()
    return await asyncio.to_thread(parse)


async def ingest_in_slices(runtime: "LiveDriver", events: Sequence[Event]) -> int:
    """``runtime.ingest(events)`` (on the loop, which owns the state), ``SLICE_EVENTS`` at a
    time, letting the loop serve other requests between slices. Events keep their order.
    Returns how many were re-sent copies (``LiveDriver.ingest``)."""
    duplicates = 0
    for start in range(0, len(events), SLICE_EVENTS):
        if start:
            await asyncio.sleep(0)
        duplicates += runtime.ingest(list(events[start : start + SLICE_EVENTS]))
    return duplicates
