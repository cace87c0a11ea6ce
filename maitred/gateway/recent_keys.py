"""Recognising an event batch sent twice, so the live state counts it once.

A batch is sent again whenever its sender cannot tell it arrived (the HTTP sink retries after a
timeout, a hook re-posts). The store keeps each event once by its key; ``RecentKeys`` gives the
live state (``LiveDriver.ingest``) the same rule over a bounded window of recent keys.
"""

from collections import OrderedDict
from collections.abc import Iterable

from maitred.events import Event
from maitred.storage.fold import keyed


class RecentKeys:
    """The idempotency keys of the last ``capacity`` events the runtime took (the store's
    ``event_key``), so a batch sent again — the HTTP sink retries after a timeout, a hook
    re-posts — moves the live state once, as the store stores it once. Bounded: a copy
    re-sent after ``capacity`` newer events counts again in the live state (never in the store)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity!r}")
        self.capacity = capacity
        self._keys: OrderedDict[str, None] = OrderedDict()

    def fresh(self, events: Iterable[Event]) -> list[Event]:
        """The events not seen among the recent ones (each remembered from now on); an event
        that cannot be keyed (a value JSON cannot hold: the store refuses it) is passed on."""
        if self.capacity == 0:
            return list(events)
        out, keys = [], self._keys
        for e in events:
            try:
                key, _ = keyed(e)
            except (TypeError, ValueError, RecursionError):
                out.append(e)
                continue
            if key in keys:
                continue
            keys[key] = None
            out.append(e)
        while len(keys) > self.capacity:
            keys.popitem(last=False)
        return out
