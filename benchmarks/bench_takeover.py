"""How long a shard is without a gateway when its holder dies: two ``maitred serve --shard s1``
on one PostgreSQL store and two simulated workers (``maitred.harness.standby``); each try kills
the holder with SIGKILL and times until the standby's ``/healthz`` answers 200 and it serves a
chat completion, then starts a new standby for the next try. The store is a throwaway schema,
dropped at the end.

    .venv/bin/python benchmarks/bench_takeover.py --db postgresql+psycopg://postgres@127.0.0.1:5432/test [--tries 5]

Last line: one JSON object with every figure, and ``reference_s``, a fixed pure-Python workload
timed in the same run (``benchmarks/reference.py``).
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import quote

import httpx
from reference import reference_s
from sqlalchemy import create_engine, text

from maitred.bind import wait_http
from maitred.harness.background import free_port
from maitred.harness.standby import ShardPair, takeover


def _worker(stack: ExitStack) -> str:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "maitred.sim.worker", "--port", str(port), "--gpu-tokens", "400000"])
    stack.callback(lambda: (proc.kill(), proc.wait()))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", timeout_s=60, process=proc)
    return url


def _takeover_gauge(url: str) -> float:
    """``maitred_takeover_seconds`` as the new holder reports it."""
    found = re.search(r"^maitred_takeover_seconds\{[^}]*\} (\S+)$", httpx.get(url + "/metrics").text, re.M)
    if found is None:
        raise RuntimeError(f"{url}/metrics has no maitred_takeover_seconds")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="a PostgreSQL URL; the run uses a schema of its own there")
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--lease-poll", type=float, default=0.5, help="the gateways' --lease-poll (default: 0.5)")
    args = parser.parse_args()
    schema = f"takeover_{uuid.uuid4().hex[:12]}"
    admin = create_engine(args.db)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = f"{args.db}{'&' if '?' in args.db else '?'}options={quote(f'-csearch_path={schema}')}"
    seconds: list[float] = []
    starting: list[float] = []  # maitred_takeover_seconds: from winning the lease to serving
    try:
        with ExitStack() as stack, tempfile.TemporaryDirectory() as logs:
            workers = [_worker(stack), _worker(stack)]
            pair = stack.enter_context(ShardPair(url, workers, Path(logs), lease_poll_s=args.lease_poll))
            for i in range(args.tries):
                seconds.append(takeover(pair, f"takeover-{i}"))
                starting.append(_takeover_gauge(pair.holder().url))
                print(
                    f"try {i + 1}: {seconds[-1]:.3f} s from SIGKILL to the standby serving "
                    f"({starting[-1]:.3f} s of it starting as the holder after winning the lease)",
                    flush=True,
                )
                pair.start()  # the next try's standby
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    figures = {
        "lease_poll_s": args.lease_poll,
        "tries": len(seconds),
        "takeover_s": [round(s, 3) for s in seconds],
        "median_s": round(statistics.median(seconds), 3),
        "max_s": round(max(seconds), 3),
        "won_to_serving_s": [round(s, 3) for s in starting],
        "reference_s": reference_s(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
