"""Restoring a previous run's programs when the gateway starts (``LiveDriver`` part).

A gateway that restarts finds its programs in the store: their state is rebuilt from their
events, tool statistics are seeded so readiness predicts from the first call, and a model
request the previous run was proxying when it stopped is ended (it died with that run).
"""

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from maitred.events import Event, LLMStart
from maitred.gateway.recent_keys import RecentKeys
from maitred.gateway.store_writer import StoreWriter
from maitred.runtime.core import RuntimeCore
from maitred.runtime.records import Phase
from maitred.runtime.state import RuntimeState

if TYPE_CHECKING:
    from maitred.gateway.shard_link import ShardLink

log = logging.getLogger("maitred.service")

#: Request ids the gateway gives the model requests it proxies.
GATEWAY_REQUEST_PREFIX = "gw-"


class RestoreAtStart:
    """Seeding and restoring the driver's state from the store (a mixin of ``LiveDriver``)."""

    state: RuntimeState
    core: RuntimeCore
    recent: RecentKeys
    writer: StoreWriter | None
    homes: "ShardLink | None"
    clock: Callable[[], float]
    kick: Callable[[], None]

    def seed(self, rows: Iterable[Any], signature_rows: Iterable[Any] = ()) -> None:
        """Tool statistics from the store, so readiness predicts from the first call."""
        self.state.seed_history(rows)
        self.state.seed_history(signature_rows, signatures=True)

    def restore(self, events: list[Event]) -> int:
        """Rebuild the programs of a previous run from their stored events (``RuntimeState.restore``
        says how and why). A model request this gateway was proxying when it stopped died with
        it: its ``llm.end`` (cancelled) is stored now, and the program is no longer reasoning.
        The replayed events' keys are remembered, so a client re-sending them is not counted
        again. Returns the number of programs restored."""
        self.recent.fresh(events)
        open_requests = {e.program_id: e.request_id for e in events if isinstance(e, LLMStart)}
        restored = self.state.restore(events)
        now = self.clock()
        for pid in restored:
            request_id = open_requests.get(pid, "")
            if self.state.programs[pid].phase is Phase.REASONING and request_id.startswith(GATEWAY_REQUEST_PREFIX):
                event = self.core.abandon(pid, now, request_id=request_id)
                if event is not None and self.writer is not None:
                    self.writer.submit([event])
        if restored and self.homes is not None:
            self.homes.check(restored)  # those another shard took while this one was down are dropped
        if restored:
            homeless = sum(self.state.programs[pid].home_worker is None for pid in restored)
            log.info("maitred: %d programs restored from the store (%d without a configured worker)", len(restored), homeless)
            self.kick()
        return len(restored)
