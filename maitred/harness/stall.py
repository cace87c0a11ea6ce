"""How long one large request stalls a gateway's other clients: the slowest ``GET /healthz``
while it is processed, against the slowest of a baseline taken just before, in the same run
(so machine load cancels out). What ``benchmarks/bench_big_bodies.py`` reports and
``tests/faults/test_gateway_big_bodies.py`` checks."""

import threading
import time
from dataclasses import dataclass

import httpx
import orjson


@dataclass(frozen=True, slots=True)
class Stall:
    status: int  # of the large request
    baseline_max_s: float  # slowest /healthz of the baseline
    during_max_s: float  # slowest /healthz overlapping the large request
    request_s: float  # how long the large request took

    @property
    def ratio(self) -> float:
        return self.during_max_s / self.baseline_max_s

    def figures(self) -> dict[str, float]:
        return {
            "status": self.status,
            "healthz_baseline_max_ms": round(self.baseline_max_s * 1e3, 1),
            "healthz_during_max_ms": round(self.during_max_s * 1e3, 1),
            "request_s": round(self.request_s, 3),
            "ratio": round(self.ratio, 2),
        }


def measure_stall(url: str, path: str, body: bytes, *, baseline: int = 200, headers: dict[str, str] | None = None) -> Stall:
    """POST ``body`` to ``url + path`` while a client polls ``/healthz`` back to back."""
    samples: list[tuple[float, float]] = []  # (start, latency)
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                start = time.perf_counter()
                client.get(url + "/healthz")
                samples.append((start, time.perf_counter() - start))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        while len(samples) < baseline:
            time.sleep(0.01)
        base = max(latency for _, latency in samples[:baseline])
        with httpx.Client(timeout=300) as client:
            began = time.perf_counter()
            response = client.post(url + path, content=body, headers={"content-type": "application/json", **(headers or {})})
            ended = time.perf_counter()
        count = len(samples)
        while len(samples) == count:  # the poll in flight when the request ended is counted too
            time.sleep(0.01)
    finally:
        stop.set()
        poller.join(60)
    during = max((latency for start, latency in samples if start + latency >= began and start <= ended), default=0.0)
    return Stall(response.status_code, base, during, ended - began)


def events_body(n: int = 74_000) -> bytes:
    """About 15 MB of tool events (under ``--max-events-mb``'s 16 MB default)."""
    now = time.time()
    return orjson.dumps(
        [
            {"type": "tool.start", "ts": now, "program_id": f"p{i % 100}", "call_id": f"c{i}-" + "y" * 100, "tool": "pytest"}
            for i in range(n)
        ]
    )


def chat_body(megabytes: float) -> bytes:
    """A chat request of about ``megabytes`` MB, in 1 kB messages."""
    count = int(megabytes * 1e6 / 1030)
    messages = [{"role": "user" if i % 2 else "assistant", "content": "word " * 200} for i in range(count)]
    return orjson.dumps({"model": "sim", "program_id": "big", "messages": messages, "max_tokens": 1})
