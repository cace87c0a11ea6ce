"""Optional KV events from the simulated worker, in SGLang's wire format (``--kv-events-config``).

With ``--kv-events-config '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}'`` (SGLang's
flag and JSON) the double publishes its cache changes on a ZMQ PUB socket exactly as SGLang
0.5.23 does (see ``kv_events`` for the format): after every change of the engine model, each
program's resident length on the GPU and in host memory is compared with what was last
published (in host memory a range of it under write-back: what was evicted), and the
difference goes out as ``BlockStored`` / ``BlockRemoved`` events over
16-token blocks (``medium`` ``GPU`` or ``CPU_PINNED``), carrying the ``session_id`` of the
program's latest request. Blocks shared by several programs (an agent's system prompt) are
stored once and removed when the last holder lets them go, as in a radix tree. The block hashes
are the sim-worker's own page hashes; like SGLang's, they are opaque ids, equal for equal
prefixes. Needs the ``kv-events`` extra (pyzmq, msgpack).
"""

import json
import time
from dataclasses import dataclass
from typing import Any

from maitred.sim.worker.engine import PAGE, RealtimeEngine, chain_from

MEDIA = ("GPU", "CPU_PINNED")


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> "KVEventsConfig":
        """SGLang's ``--kv-events-config`` JSON; only the ``zmq`` publisher on a TCP endpoint."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--kv-events-config: not JSON ({exc})") from None
        if not isinstance(raw, dict) or raw.get("publisher") != "zmq":
            raise ValueError('--kv-events-config: expected {"publisher": "zmq", "endpoint": "tcp://HOST:PORT"}')
        endpoint = raw.get("endpoint", "tcp://*:5557")
        if not isinstance(endpoint, str) or not endpoint.startswith("tcp://") or not endpoint.rsplit(":", 1)[-1].isdigit():
            raise ValueError(f"--kv-events-config: endpoint must be tcp://HOST:PORT, got {endpoint!r}")
        topic = raw.get("topic", "")
        if not isinstance(topic, str):
            raise ValueError("--kv-events-config: topic must be a string")
        return cls(endpoint, topic)

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def descriptor(self) -> dict[str, Any]:
        """The ``kv_events`` entry of ``/server_info`` (SGLang's ``describe_kv_events_publisher``)."""
        host = self.endpoint[len("tcp://") :].rsplit(":", 1)[0]
        return {
            "publisher": "zmq",
            "endpoint_host": host,
            "endpoint_port_base": self.port,
            "topic": self.topic,
            "block_size": PAGE,
            "dp_size": 1,
        }


class KVEventPublisher:
    """Publishes ``engine``'s residency changes; install with ``engine.on_change = publisher.publish``."""

    def __init__(self, config: KVEventsConfig, engine: RealtimeEngine) -> None:
        try:
            import msgpack
            import zmq
        except ImportError:
            raise ValueError("--kv-events-config: needs pyzmq and msgpack (pip install 'maitred[kv-events]')") from None
        self.config = config
        self.engine = engine
        self._pack = msgpack.packb
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(config.endpoint)
        except zmq.ZMQError as exc:
            self._socket.close()
            raise ValueError(f"--kv-events-config: cannot bind {config.endpoint} ({exc})") from None
        self._topic = config.topic.encode()
        self._seq = 0
        self._claimed: dict[str, dict[str, dict[int, int]]] = {}  # program -> medium -> page -> block hash
        self._holders: dict[tuple[str, int], int] = {}  # (medium, block) -> programs holding it

    def close(self) -> None:
        self._socket.close()

    def publish(self) -> None:
        events: list[dict[str, Any]] = []
        worker = self.engine.worker
        for pid, seg in worker.segments.items():
            tokens = self.engine.index.tokens(pid)
            if tokens is None:
                continue
            prefix = worker.prefixes.get(seg.agent)
            shared = prefix.tokens if prefix is not None else 0
            gpu = min(len(tokens), shared + seg.gpu) if seg.gpu or (prefix and prefix.resident) else 0
            host = (min(len(tokens), shared + seg.host_from), min(len(tokens), shared + seg.host)) if seg.host else (0, 0)
            self._resize(pid, MEDIA[0], tokens, 0, gpu // PAGE, events)
            self._resize(pid, MEDIA[1], tokens, host[0] // PAGE, host[1] // PAGE, events)
        for pid in [p for p in self._claimed if p not in worker.segments]:
            for medium in MEDIA:
                self._resize(pid, medium, [], 0, 0, events)
            del self._claimed[pid]
        if events:
            payload = self._pack([time.time(), events, None])
            self._socket.send_multipart([self._topic, self._seq.to_bytes(8, "big"), payload])
            self._seq += 1

    def _resize(self, pid: str, medium: str, tokens: list[int], lo: int, hi: int, events: list[dict[str, Any]]) -> None:
        """Publish ``pid``'s pages ``[lo, hi)`` as what ``medium`` holds of it."""
        held = self._claimed.setdefault(pid, {}).setdefault(medium, {})
        if len(held) == max(hi - lo, 0) and (not held or (min(held) == lo and max(held) == hi - 1)):
            return
        gone = [h for h in (held.pop(i) for i in sorted(held) if not lo <= i < hi) if self._release(medium, h)]
        if gone:
            events.append({"type": "BlockRemoved", "block_hashes": gone, "medium": medium})
        missing = [i for i in range(lo, hi) if i not in held]
        if not missing:
            return
        known = 0  # pages [0, known) of the chain are held here already, so hashing starts after them
        while known in held:
            known += 1
        chain = [held[i] for i in range(known)] + chain_from(tokens[: hi * PAGE], known, held[known - 1] if known else 0)
        runs: list[list[int]] = []  # contiguous runs of newly stored pages, one event each (as SGLang merges them)
        for i in missing:
            held[i] = chain[i]
            if self._claim(medium, chain[i]):
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
        session = self.engine.sessions.get(pid)
        for run in runs:
            event: dict[str, Any] = {
                "type": "BlockStored",
                "block_hashes": [chain[i] for i in run],
                "parent_block_hash": chain[run[0] - 1] if run[0] else None,
                "token_ids": tokens[run[0] * PAGE : (run[-1] + 1) * PAGE],
                "block_size": PAGE,
                "lora_id": None,
                "medium": medium,
            }
            if session is not None:
                event["session_id"] = session
            events.append(event)

    def _claim(self, medium: str, block: int) -> bool:
        """True when the block was held by no program before (so it is newly stored)."""
        key = (medium, block)
        self._holders[key] = self._holders.get(key, 0) + 1
        return self._holders[key] == 1

    def _release(self, medium: str, block: int) -> bool:
        key = (medium, block)
        left = self._holders.get(key, 0) - 1
        if left > 0:
            self._holders[key] = left
            return False
        self._holders.pop(key, None)
        return True
