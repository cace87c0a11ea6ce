"""How long one large request stalls every other client of the gateway: the slowest ``GET
/healthz`` while a 15 MB ``/v1/events`` batch or a large chat body is processed, against the
slowest of 200 just before (``maitred.harness.stall``). A simulated worker and the gateway run
as separate processes on 127.0.0.1.

    .venv/bin/python benchmarks/bench_big_bodies.py [--chat-mb 32]

Last line: one JSON object with every figure.
"""

import argparse
import json
import subprocess
import sys

from maitred.bind import wait_http
from maitred.harness.background import free_port
from maitred.harness.stall import chat_body, events_body, measure_stall


def _start(command: list[str], ready: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    wait_http(ready, timeout_s=60, process=process)
    return process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chat-mb", type=float, default=30.0, help="size of the chat body (default: 30, under the 32 MB limit)")
    args = parser.parse_args()
    worker_port, gateway_port = free_port(), free_port()
    worker = _start(
        [
            sys.executable,
            "-m",
            "maitred",
            "sim-worker",
            "--port",
            str(worker_port),
            "--gpu-tokens",
            "100000000",
            "--time-scale",
            "100",
        ],
        f"http://127.0.0.1:{worker_port}/health",
    )
    gateway = _start(
        [sys.executable, "-m", "maitred", "serve", "--port", str(gateway_port), "--no-db", "--log-level", "warning",
         "--worker", f"http://127.0.0.1:{worker_port}", "--max-body-mb", str(max(args.chat_mb * 1.1, 32))],
        f"http://127.0.0.1:{gateway_port}/healthz",
    )  # fmt: skip
    url = f"http://127.0.0.1:{gateway_port}"
    try:
        events = events_body()
        chat = chat_body(args.chat_mb)
        figures = {
            "events_mb": round(len(events) / 1e6, 1),
            "events": measure_stall(url, "/v1/events", events).figures(),
            "chat_mb": round(len(chat) / 1e6, 1),
            "chat": measure_stall(url, "/v1/chat/completions", chat).figures(),
        }
    finally:
        for process in (gateway, worker):
            process.terminate()
            process.wait(30)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
