"""Exact KV residency from SGLang's KV events (optional: the ``kv-events`` extra, pyzmq + msgpack).

SGLang started with ``--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'``
publishes every change of its radix cache on a ZMQ PUB socket per data-parallel rank (port =
base + rank; ``/server_info`` describes it under ``kv_events``). Wire format, from SGLang 0.5.23
``python/sglang/srt/disaggregation/kv_events.py``: a multipart message ``[topic, seq, payload]``
with ``seq`` an 8-byte big-endian counter and ``payload`` a msgpack ``EventBatch`` array
``[ts, events, attn_dp_rank]``. Each event is a tagged msgpack map (``type`` is the class name,
the other keys its fields; optional fields left unset are omitted), the encoding vLLM uses too:

- ``BlockStored``: ``block_hashes``, ``parent_block_hash`` (None at the root), ``token_ids``,
  ``block_size``, ``lora_id``, ``medium`` (``GPU``, ``CPU_PINNED`` for a HiCache host copy, ...),
  ``session_id`` (the request's ``session_id``, when the cache reports it);
- ``BlockRemoved``: ``block_hashes``, ``medium``;
- ``AllBlocksCleared``.

Older publishers sent events as positional arrays ``[tag, field, ...]``; both are read.

``ResidencyTracker`` folds the events into what is resident where: per block, its chain depth in
tokens and the media holding it; per session, how many of its prefix tokens are resident. A
request's cache hit is the longest resident prefix, and a radix cache evicts leaves first, so a
session's residency is the depth of the deepest block it stored that is still held. Sessions
are whatever the client put in the request's ``session_id`` (the gateway can forward the
program id there: SGLang 0.5.23 accepts ``session_id`` on ``/generate``, ``/v1/completions`` and
``/v1/chat/completions`` without changing the prompt). A gap in ``seq`` means events were lost
(PUB drops them for a slow subscriber): the tracker counts it, and its figures are then a lower
bound until the cache is next cleared. A ``seq`` that goes back means the publisher restarted
(with an empty cache): the tracker starts afresh.
"""

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

GPU = "GPU"
#: ``BlockStored`` / ``BlockRemoved`` fields in the positional (array) encoding, after the tag.
_POSITIONAL = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


class KVEventError(ValueError):
    """A KV-event message that is not SGLang's format; the message names the part."""


@dataclass(frozen=True, slots=True)
class KVEvent:
    kind: str  # BlockStored, BlockRemoved or AllBlocksCleared
    block_hashes: tuple[int, ...] = ()
    parent_block_hash: int | None = None
    tokens: int = 0  # len(token_ids) for BlockStored
    block_size: int = 0
    medium: str = GPU
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    attn_dp_rank: int | None = None


def _event(raw: Any, where: str) -> KVEvent | None:
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], str):
        names = _POSITIONAL.get(raw[0])
        if names is None:
            return None
        raw = {"type": raw[0], **dict(zip(names, raw[1:]))}
    if not isinstance(raw, Mapping) or not isinstance(raw.get("type"), str):
        raise KVEventError(f"{where}: expected a tagged event (a map with 'type')")
    kind = raw["type"]
    if kind not in _POSITIONAL:
        return None  # a kind this reader does not know yet: skipped, as vLLM's readers do
    hashes = raw.get("block_hashes", [])
    if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
        raise KVEventError(f"{where}.block_hashes: expected a list of integers")
    medium = raw.get("medium") or GPU
    if kind != "BlockStored":
        return KVEvent(kind, tuple(hashes), medium=medium)
    token_ids = raw.get("token_ids", [])
    if not isinstance(token_ids, list):
        raise KVEventError(f"{where}.token_ids: expected a list")
    parent = raw.get("parent_block_hash")
    if parent is not None and not isinstance(parent, int):
        raise KVEventError(f"{where}.parent_block_hash: expected an integer or nil")
    block_size = raw.get("block_size") or 0
    session = raw.get("session_id")
    return KVEvent(
        kind, tuple(hashes), parent, len(token_ids), int(block_size), medium, session if isinstance(session, str) else None
    )


def decode_batch(payload: bytes) -> EventBatch:
    """One ``EventBatch`` from its msgpack payload."""
    import msgpack

    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KVEventError(f"payload: not msgpack ({exc})") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise KVEventError("payload: expected an EventBatch array [ts, events, attn_dp_rank]")
    ts = raw[0]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise KVEventError(f"payload.ts: expected a number, got {ts!r}")
    rank = raw[2] if len(raw) > 2 else None
    events = tuple(e for i, r in enumerate(raw[1]) if (e := _event(r, f"payload.events[{i}]")) is not None)
    return EventBatch(float(ts), events, rank if isinstance(rank, int) else None)


@dataclass(slots=True)
class _Block:
    parent: int | None
    tokens: int
    depth: int  # tokens from the root through this block
    media: set[str]
    session: str | None


@dataclass
class ResidencyTracker:
    """Residency of one worker's KV (one data-parallel rank), folded from its events.
    Thread-safe: a subscriber thread applies events while the scheduler reads."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    sessions: dict[str, list[int]] = field(default_factory=dict)
    batches: int = 0
    gaps: int = 0  # sequence numbers skipped (events lost)
    orphans: int = 0  # blocks stored under a parent never seen (depth undercounted)
    restarts: int = 0  # sequence went back: the publisher restarted, state was reset
    last_seq: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def apply(self, batch: EventBatch, seq: int | None = None) -> None:
        with self._lock:
            if seq is not None:
                if self.last_seq is not None and seq > self.last_seq + 1:
                    self.gaps += seq - self.last_seq - 1
                elif self.last_seq is not None and seq <= self.last_seq:
                    # the counter went back: the publisher restarted, and a restarted worker's cache is empty
                    self.restarts += 1
                    self.blocks.clear()
                    self.sessions.clear()
                self.last_seq = seq
            self.batches += 1
            for event in batch.events:
                self._apply(event)

    def _apply(self, event: KVEvent) -> None:
        if event.kind == "AllBlocksCleared":
            self.blocks.clear()
            self.sessions.clear()
        elif event.kind == "BlockRemoved":
            for h in event.block_hashes:
                block = self.blocks.get(h)
                if block is not None:
                    block.media.discard(event.medium)
                    if not block.media:
                        del self.blocks[h]
        else:
            self._store(event)

    def _store(self, event: KVEvent) -> None:
        parent = event.parent_block_hash
        per_block = event.tokens // max(len(event.block_hashes), 1)
        for i, h in enumerate(event.block_hashes):
            block = self.blocks.get(h)
            if block is not None:
                block.media.add(event.medium)
            else:
                above = self.blocks.get(parent) if parent is not None else None
                if parent is not None and above is None:
                    self.orphans += 1
                tokens = per_block if i < len(event.block_hashes) - 1 else event.tokens - per_block * i
                self.blocks[h] = _Block(parent, tokens, (above.depth if above else 0) + tokens, {event.medium}, event.session_id)
                if event.session_id is not None:
                    self.sessions.setdefault(event.session_id, []).append(h)
            parent = h

    def session_tokens(self, session_id: str, medium: str = GPU) -> int:
        """Prefix tokens of ``session_id``'s requests held in ``medium`` (0 if none or unknown)."""
        with self._lock:
            stored = self.sessions.get(session_id, [])
            while stored and stored[-1] not in self.blocks:  # forget blocks gone from every medium
                stored.pop()
            for h in reversed(stored):
                block = self.blocks.get(h)
                if block is not None and medium in block.media:
                    return block.depth
            return 0

    def prefix_tokens(self, block_hash: int, medium: str = GPU) -> int:
        """Resident tokens of the chain ending at ``block_hash``: its depth, if it is held in
        ``medium``, else that of its deepest ancestor that is."""
        with self._lock:
            h: int | None = block_hash
            while h is not None:
                block = self.blocks.get(h)
                if block is None:
                    return 0
                if medium in block.media:
                    return block.depth
                h = block.parent
            return 0

    def held_tokens(self, medium: str = GPU) -> int:
        """Tokens held in ``medium`` over all blocks (each block counted once)."""
        with self._lock:
            return sum(b.tokens for b in self.blocks.values() if medium in b.media)


def endpoints_from_server_info(worker_url: str, server_info: Mapping[str, Any]) -> list[str]:
    """The SUB endpoints of a worker's KV-event publishers, one per data-parallel rank, from the
    ``kv_events`` descriptor of its ``/server_info`` (empty when it publishes none). The
    descriptor's host may be a bind wildcard, so the worker URL's host is used, as SGLang asks."""
    info = server_info.get("kv_events")
    if not isinstance(info, Mapping) or info.get("publisher") != "zmq":
        return []
    base = info.get("endpoint_port_base")
    ranks = info.get("dp_size", 1)
    if not isinstance(base, int) or not isinstance(ranks, int) or ranks < 1:
        raise KVEventError("server_info.kv_events: endpoint_port_base and dp_size must be integers")
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return [f"tcp://{host}:{base + r}" for r in range(ranks)]


class KVEventSubscriber:
    """Subscribes to one publisher (``tcp://host:port``) on a background thread and feeds a
    ``ResidencyTracker``. A malformed message is logged and counted, never fatal."""

    def __init__(self, endpoint: str, tracker: ResidencyTracker | None = None, *, topic: str = "", poll_ms: int = 100) -> None:
        self.endpoint = endpoint
        self.tracker = tracker or ResidencyTracker()
        self.topic = topic
        self.malformed = 0
        self._poll_ms = poll_ms
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> "KVEventSubscriber":
        self._thread = threading.Thread(target=self._run, name=f"kv-events {self.endpoint}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"KV-event subscriber for {self.endpoint} did not start")
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def __enter__(self) -> "KVEventSubscriber":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        import zmq

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sock.connect(self.endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if poller.poll(self._poll_ms):
                    self.handle(sock.recv_multipart())
        finally:
            sock.close()

    def handle(self, parts: Iterable[bytes]) -> None:
        parts = list(parts)
        try:
            if len(parts) != 3 or len(parts[1]) != 8:
                raise KVEventError(f"message: expected [topic, 8-byte seq, payload], got {len(parts)} parts")
            self.tracker.apply(decode_batch(parts[2]), int.from_bytes(parts[1], "big"))
        except KVEventError as exc:
            self.malformed += 1
            log.warning("KV event from %s skipped: %s", self.endpoint, exc)
