"""Dynamo's workers as the live driver sees workers: health, capacity and load per instance.

``Fleet`` reads what Dynamo's discovery and KV router already know: the instances serving the
worker endpoint (``Client.instance_ids``), each instance's model deployment card (block size,
``total_kv_blocks`` per data-parallel rank, native host offloading) through
``FpmEventSubscriber``, and the KV router's own account of what runs where
(``KvRouter.get_potential_loads``: active requests and decode blocks per instance, kept from
the workers' KV events and the requests it routed). ``DynamoWorker`` is one instance behind
``maitred.gateway.backend.WorkerBackend``; its id in the runtime state is the instance id in
decimal, the value Dynamo's ``routing.backend_instance_id`` takes.
"""

import asyncio
import json
import logging
import time
from typing import Any

from maitred.gateway.sglang.client import WorkerCapacity, WorkerLoad, WorkerProtocolError

log = logging.getLogger("maitred.service")
#: How long one reading of the router's loads serves the workers that ask for it (a step
#: asks every worker at once).
LOADS_FRESH_S = 0.05


def card_capacity(card: dict[str, Any]) -> tuple[int, int, int] | None:
    """``(gpu_tokens, host_tokens, dp_size)`` from a model deployment card, None when it does not
    say: ``kv_cache_block_size`` x ``runtime_config.total_kv_blocks`` per rank (summed over the
    worker's ranks, as ``WorkerCapacity.gpu_tokens`` is), and the native host offloading pool
    where the card has one (``dynamo.common.native_offloading``; SGLang's HiCache)."""
    runtime_config = card.get("runtime_config") or {}
    block_size, blocks = card.get("kv_cache_block_size"), runtime_config.get("total_kv_blocks")
    if not (isinstance(block_size, int) and block_size > 0 and isinstance(blocks, int) and blocks > 0):
        return None
    dp_size = runtime_config.get("data_parallel_size")
    dp_size = dp_size if isinstance(dp_size, int) and dp_size > 0 else 1
    host = 0
    try:
        from dynamo.common.native_offloading import get_native_offloading_capacity_tokens

        host = get_native_offloading_capacity_tokens(runtime_config.get("runtime_data") or {}) or 0
    except Exception:  # an older Dynamo without it, or a card it cannot read: no host pool counted
        host = 0
    return block_size * blocks * dp_size, int(host) * dp_size, dp_size


class Fleet:
    """The worker endpoint's instances, their cards and the KV router's loads."""

    def __init__(self, client: Any, cards: Any, router: Any) -> None:
        self.client, self._cards, self.router = client, cards, router
        self._parsed: dict[str, dict[str, Any]] = {}
        self._loads: dict[int, WorkerLoad] = {}
        self._loads_at = float("-inf")
        self._reading: asyncio.Lock | None = None

    def instance_ids(self) -> set[int]:
        try:
            return set(self.client.instance_ids())
        except Exception as exc:  # the runtime is shutting down
            log.debug("maitred: Dynamo instance list unavailable: %s", exc)
            return set()

    def card(self, instance_id: int) -> dict[str, Any] | None:
        try:
            raw = self._cards.get_model_cards().get(str(instance_id))
        except Exception as exc:
            log.debug("maitred: Dynamo model cards unavailable: %s", exc)
            return None
        if raw is None:
            return None
        parsed = self._parsed.get(raw)
        if parsed is None:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = {}
            self._parsed[raw] = parsed if isinstance(parsed, dict) else {}
        return parsed

    def block_size(self) -> int | None:
        """The workers' KV block size, from the first card that says (the KV router needs it)."""
        for instance_id in sorted(self.instance_ids()):
            card = self.card(instance_id)
            size = None if card is None else card.get("kv_cache_block_size")
            if isinstance(size, int) and size > 0:
                return size
        return None

    async def loads(self) -> dict[int, WorkerLoad]:
        """Load per instance as the KV router accounts it, read at most once per ``LOADS_FRESH_S``."""
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            if time.monotonic() - self._loads_at < LOADS_FRESH_S:
                return self._loads
            rows = await self.router.get_potential_loads([])
            loads: dict[int, list[dict[str, Any]]] = {}
            for row in rows:
                loads.setdefault(int(row["worker_id"]), []).append(row)
            block = self.block_size() or 1
            self._loads = {
                iid: WorkerLoad(
                    running=sum(int(r.get("active_requests") or 0) for r in ranks),
                    waiting=0,  # the router's queue is not per worker
                    used_tokens=sum(int(r.get("potential_decode_blocks") or 0) for r in ranks) * block,
                    token_usage=0.0,
                    cache_hit_rate=None,
                    ranks=len(ranks),
                )
                for iid, ranks in loads.items()
            }
            self._loads_at = time.monotonic()
            return self._loads


class DynamoWorker:
    """One Dynamo worker instance as a ``WorkerBackend``. Warmups are not sent through Dynamo
    (``warmup`` and ``tokenize`` refuse; the component runs with warmups off)."""

    def __init__(self, fleet: Fleet, instance_id: int) -> None:
        self.fleet, self.instance_id = fleet, instance_id

    def __repr__(self) -> str:
        return f"DynamoWorker({self.instance_id})"

    async def healthy(self) -> bool:
        return self.instance_id in self.fleet.instance_ids()

    async def capacity(self) -> WorkerCapacity:
        card = self.fleet.card(self.instance_id)
        sizes = None if card is None else card_capacity(card)
        if card is None or sizes is None:
            raise WorkerProtocolError(f"instance {self.instance_id}: no model card with kv_cache_block_size and total_kv_blocks")
        gpu, host, dp_size = sizes
        source = card.get("source_path")
        return WorkerCapacity(gpu, host, dp_size, source if isinstance(source, str) else None)

    async def host_capacity(self) -> int | None:
        return 0  # the card's native offloading pool is counted in ``capacity``

    async def load(self) -> WorkerLoad:
        load = (await self.fleet.loads()).get(self.instance_id)
        if load is None:
            raise WorkerProtocolError(f"instance {self.instance_id}: the KV router reports no load for it")
        return load

    async def warmup(self, text_or_input_ids: str | list[int], *, priority: int | None = None) -> int | None:
        raise WorkerProtocolError("warmups are not sent through Dynamo")

    async def tokenize(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = False
    ) -> list[int]:
        raise WorkerProtocolError("the Dynamo component does not tokenize for warmups")
