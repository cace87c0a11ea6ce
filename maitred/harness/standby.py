"""One shard served by a holder and a standby: two ``maitred serve --shard NAME`` processes on
the same PostgreSQL store and workers, for the tests and for measuring a takeover.

``ShardPair`` starts them (and a replacement standby after each kill), tells which one holds
the lease from their ``/healthz``, and stops every process it started on exit; ``takeover``
kills the holder with SIGKILL and times how long until the standby answers ``/healthz`` with
200 and serves a chat completion.
"""

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from maitred.harness.background import free_port


@dataclass
class ShardGateway:
    """One ``maitred serve --shard`` child process, its stderr kept in ``log``."""

    proc: "subprocess.Popen[bytes]"
    url: str
    log: Path

    def health(self) -> httpx.Response | None:
        """Its ``/healthz`` answer (None: not answering)."""
        try:
            return httpx.get(self.url + "/healthz", timeout=2.0)
        except httpx.HTTPError:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class ShardPair:
    """A holder and a standby of shard ``shard`` on ``db_url`` (PostgreSQL) and ``workers``."""

    def __init__(
        self,
        db_url: str,
        workers: Sequence[str],
        log_dir: Path,
        *,
        shard: str = "s1",
        lease_poll_s: float = 0.5,
        standby_hold_s: float | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.args = ["--db", db_url, "--shard", shard, "--lease-poll", str(lease_poll_s), "--tick", "0.2"]
        if standby_hold_s is not None:
            self.args += ["--standby-hold", str(standby_hold_s)]
        self.args += [a for w in workers for a in ("--worker", w)]
        self.log_dir, self.timeout_s = log_dir, timeout_s
        self.started: list[ShardGateway] = []

    def start(self) -> ShardGateway:
        """One more gateway of the shard, once it answers ``/healthz`` (200 or 503)."""
        port = free_port()
        log = self.log_dir / f"serve-{len(self.started)}.log"
        with log.open("ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "maitred.gateway.serve", "--port", str(port), *self.args],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        gateway = ShardGateway(proc, f"http://127.0.0.1:{port}", log)
        self.started.append(gateway)
        self.wait_for(lambda: gateway.health() is not None, f"{gateway.url} to answer /healthz", gateway)
        return gateway

    def running(self) -> list[ShardGateway]:
        return [g for g in self.started if g.proc.poll() is None]

    def holder(self) -> ShardGateway:
        """The one running gateway whose ``/healthz`` is 200, once the others say 503."""
        found: list[ShardGateway] = []

        def one_holder() -> bool:
            codes = [(g, g.health()) for g in self.running()]
            found[:] = [g for g, r in codes if r is not None and r.status_code == 200]
            return len(found) == 1 and all(r is not None and r.status_code in (200, 503) for _, r in codes)

        self.wait_for(one_holder, "exactly one holder")
        return found[0]

    def standbys(self) -> list[ShardGateway]:
        holder = self.holder()
        return [g for g in self.running() if g is not holder]

    def wait_for(self, condition: Callable[[], bool], what: str, gateway: ShardGateway | None = None) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not condition():
            if gateway is not None and gateway.proc.poll() is not None:
                raise RuntimeError(f"maitred serve exited with {gateway.proc.returncode}: {gateway.log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {self.timeout_s:g} s for {what}")
            time.sleep(0.02)

    def __enter__(self) -> "ShardPair":
        try:
            self.start()
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for gateway in self.started:
            gateway.stop()


def chat(url: str, program_id: str) -> httpx.Response:
    body = {"model": "m", "program_id": program_id, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=30.0)


def takeover(pair: ShardPair, program_id: str) -> float:
    """Kill the holder with SIGKILL; seconds until a standby's ``/healthz`` answers 200 and it
    serves a chat completion (the one that does is then the holder)."""
    holder, standbys = pair.holder(), pair.standbys()
    started = time.monotonic()
    holder.proc.kill()
    holder.proc.wait()
    served: list[float] = []

    def one_serves() -> bool:
        for gateway in standbys:
            health = gateway.health()
            if health is not None and health.status_code == 200 and chat(gateway.url, program_id).status_code == 200:
                served.append(time.monotonic() - started)
                return True
        return False

    pair.wait_for(one_serves, "a standby to take over")
    return served[0]
