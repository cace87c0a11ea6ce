"""maitred shards behind a real balancer, as docs/scale.md sets them up: K ``maitred serve``
processes, each with its own two ``maitred sim-worker`` processes and its own SQLite store, and
HAProxy or nginx in front of them running the config shipped in ``examples/``, with only its
listening address and its shard lines changed to the ports of this run. So a test that passes
here proves the shipped file works, not a copy of it. ``start_paired_sharded`` does the same for
shards of a holder and a standby each (``maitred.harness.standby.ShardPair``, a PostgreSQL schema
per shard) behind ``examples/haproxy-standby.cfg``.

Every process is a child of the test, with its output in a log file under the test's folder;
``ExitStack`` callbacks stop each one, also when the test fails."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from maitred.harness.background import free_port, wait_http
from maitred.harness.standby import ShardPair
from maitred.storage import SessionStore
from maitred.storage.queries import ProgramSummary
from tests.helpers import wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BALANCERS = ("haproxy", "nginx")
#: ``maitred serve --standby-hold`` of the gateways behind ``examples/haproxy-standby.cfg``, as
#: docs/scale.md starts them.
STANDBY_HOLD_S = 10.0
#: Where Debian puts both binaries; not on a non-root user's PATH.
SBIN = ("/usr/sbin", "/usr/local/sbin")


def balancer_binary(kind: str) -> str | None:
    return shutil.which(kind, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def require_balancer(kind: str) -> str:
    """The binary of ``kind``; skip where it is missing (fail in CI, whose ``.ci/run`` installs it)."""
    binary = balancer_binary(kind)
    if binary is None:
        message = f"{kind} is not installed (apt-get install {kind})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


class Process:
    """A child in its own process group, its stdout and stderr in ``log``. ``stop`` asks it to
    exit (``SIGTERM``) and kills what is left of its group after ``timeout_s``: nginx's workers
    outlive a master killed with ``SIGKILL``."""

    def __init__(self, argv: Sequence[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """``SIGKILL`` to its whole group, waited for."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def maitred_command(*args: str) -> list[str]:
    """``maitred ARGS`` from this checkout (the console script may point at another one)."""
    return [sys.executable, "-m", "maitred", *args]


def stored_programs(db_url: str) -> dict[str, ProgramSummary]:
    """What the store at ``db_url`` holds, by program: what ``maitred programs --db`` lists."""
    store = SessionStore(db_url)
    try:
        return {p.program_id: p for p in store.programs(limit=100_000)}
    finally:
        store.close()


@dataclass
class Shard:
    """One ``maitred serve`` and its own workers and store."""

    name: str
    port: int
    db_url: str
    gateway: Process
    workers: list[Process]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def programs(self) -> dict[str, ProgramSummary]:
        return stored_programs(self.db_url)

    def kill(self) -> None:
        """The whole shard gone at once, as when its machine dies: its gateway and its workers
        (and with them their KV caches) killed with ``SIGKILL``."""
        for process in (self.gateway, *self.workers):
            process.kill()


@dataclass
class PairedShard:
    """A shard served by a holder and a standby (``maitred serve --shard NAME``) on its own
    workers and its own PostgreSQL schema."""

    name: str
    db_url: str
    pair: ShardPair
    workers: list[Process]

    def programs(self) -> dict[str, ProgramSummary]:
        return stored_programs(self.db_url)


def start_workers(
    count: int, root: Path, stack: ExitStack, *, workers_per_shard: int = 2, time_scale: float = 50.0
) -> list[tuple[list[int], list[Process]]]:
    """Each shard's workers, started together and answering: their ports and processes, by shard;
    ``time_scale``: how much faster than a GPU the simulated workers answer."""
    plans = []
    for i in range(1, count + 1):
        ports = [free_port() for _ in range(workers_per_shard)]
        workers = []
        for j, port in enumerate(ports, 1):
            argv = maitred_command("sim-worker", "--port", str(port), "--gpu-tokens", "400000", "--log-level", "warning")
            argv += ["--time-scale", str(time_scale)]
            worker = Process(argv, root / f"shard{i}-worker{j}.log")
            stack.callback(worker.stop)
            workers.append(worker)
        plans.append((ports, workers))
    for ports, workers in plans:
        for port, worker in zip(ports, workers):
            wait_http(f"http://127.0.0.1:{port}/health", timeout_s=120, process=worker.proc)
    return plans


def start_shards(count: int, root: Path, stack: ExitStack, *, time_scale: float = 50.0) -> list[Shard]:
    """``count`` shards, started together (the workers first: a gateway waits for them)."""
    shards = []
    for i, (ports, workers) in enumerate(start_workers(count, root, stack, time_scale=time_scale), 1):
        port = free_port()
        db_url = f"sqlite:///{root / f'shard{i}.db'}"
        argv = maitred_command("serve", "--port", str(port), "--db", db_url, "--tick", "0.2", "--log-level", "warning")
        for worker_port in ports:
            argv += ["--worker", f"http://127.0.0.1:{worker_port}"]
        gateway = Process(argv, root / f"shard{i}-serve.log")
        stack.callback(gateway.stop)
        shards.append(Shard(f"shard{i}", port, db_url, gateway, workers))
    for shard in shards:
        wait_http(shard.url + "/healthz", timeout_s=120, process=shard.gateway.proc)
    return shards


def start_paired_shards(
    count: int, schema_url: Callable[[], str], root: Path, stack: ExitStack, *, time_scale: float = 50.0
) -> list[PairedShard]:
    """``count`` shards of a holder and a standby each, every shard on a fresh schema from
    ``schema_url`` (``tests.helpers.throwaway_schemas``), once one of its gateways holds the lease."""
    shards = []
    for i, (ports, workers) in enumerate(start_workers(count, root, stack, time_scale=time_scale), 1):
        name, db_url = f"shard{i}", schema_url()
        (root / name).mkdir()
        workers_urls = [f"http://127.0.0.1:{p}" for p in ports]
        pair = ShardPair(db_url, workers_urls, root / name, shard=name, standby_hold_s=STANDBY_HOLD_S)
        stack.enter_context(pair)
        pair.holder()
        shards.append(PairedShard(name, db_url, pair, workers))
    return shards


def _substitute(text: str, pattern: str, replace: Callable[[re.Match[str]], str], what: str) -> str:
    """``text`` with every line matching ``pattern`` dropped but the first, which becomes
    ``replace(match)``; a file without such a line is an error naming ``what``."""
    found = list(re.finditer(pattern, text, flags=re.MULTILINE))
    if not found:
        raise ValueError(f"the shipped config has no {what} line (pattern {pattern!r}): update the harness with it")
    out, at = [], 0
    for n, match in enumerate(found):
        out.append(text[at : match.start()])
        if n == 0:
            out.append(replace(match))
        at = match.end() + (1 if n and text[match.end() : match.end() + 1] == "\n" else 0)
    out.append(text[at:])
    return "".join(out)


def render_haproxy(text: str, port: int, shard_ports: Sequence[int]) -> str:
    """``examples/haproxy.cfg`` listening on ``port``, one ``server`` line per shard."""
    text = _substitute(text, r"^([ \t]*)bind 127\.0\.0\.1:8000$", lambda m: f"{m[1]}bind 127.0.0.1:{port}", "bind")

    def servers(m: re.Match[str]) -> str:
        return "\n".join(f"{m[1]}server shard{i} 127.0.0.1:{p}{m[2]}" for i, p in enumerate(shard_ports, 1))

    return _substitute(text, r"^([ \t]*)server shard\d+ 127\.0\.0\.1:\d+(.*)$", servers, "server")


def render_haproxy_standby(text: str, port: int, entry_ports: Sequence[int], gateway_ports: Sequence[Sequence[int]]) -> str:
    """``examples/haproxy-standby.cfg`` listening on ``port``: one ``server`` line per shard, to
    the shard's ``listen`` section on its port of ``entry_ports``, and one such section per shard,
    a copy of the first with its gateways on ``gateway_ports`` (each address of the shipped
    section's ``server`` lines, in the order they first appear, is one gateway)."""
    text = _substitute(text, r"^([ \t]*)bind 127\.0\.0\.1:8000$", lambda m: f"{m[1]}bind 127.0.0.1:{port}", "bind")

    def entries(m: re.Match[str]) -> str:
        return "\n".join(f"{m[1]}server shard{i} 127.0.0.1:{p}{m[2]}" for i, p in enumerate(entry_ports, 1))

    text = _substitute(text, r"^([ \t]*)server shard\d+ 127\.0\.0\.1:\d+(.*)$", entries, "server shardN")
    server = r"^([ \t]*server \S+ 127\.0\.0\.1:)(\d+)"

    def sections(m: re.Match[str]) -> str:
        shipped = list(dict.fromkeys(s[2] for s in re.finditer(server, m[0], flags=re.MULTILINE)))
        if not shipped:
            raise ValueError("the shipped config's first listen section has no server line: update the harness with it")
        out = []
        for i, (entry, ports) in enumerate(zip(entry_ports, gateway_ports), 1):
            if len(ports) != len(shipped):
                raise ValueError(f"shard{i}: {len(ports)} gateways, the shipped section has {len(shipped)}")
            to = dict(zip(shipped, map(str, ports)))
            section = re.sub(r"^listen shard\d+", f"listen shard{i}", m[0])
            section = re.sub(r"^([ \t]*bind 127\.0\.0\.1:)\d+$", rf"\g<1>{entry}", section, flags=re.MULTILINE)
            out.append(re.sub(server, lambda s, to=to: s[1] + to[s[2]], section, flags=re.MULTILINE))
        return "\n".join(out)

    return _substitute(text, r"^listen shard\d+\b.*\n(?:[ \t]+\S.*\n)*", sections, "listen shardN")


def render_nginx(text: str, port: int, shard_ports: Sequence[int]) -> str:
    """``examples/nginx.conf`` listening on ``port``, one upstream ``server`` line per shard."""
    text = _substitute(text, r"^([ \t]*)listen 127\.0\.0\.1:8000;$", lambda m: f"{m[1]}listen 127.0.0.1:{port};", "listen")

    def servers(m: re.Match[str]) -> str:
        return "\n".join(f"{m[1]}server 127.0.0.1:{p}{m[2]}" for p in shard_ports)

    return _substitute(text, r"^([ \t]*)server 127\.0\.0\.1:\d+(.*)$", servers, "server")


@dataclass
class Balancer:
    """HAProxy or nginx in front of the shards, on ``port``."""

    kind: str
    port: int
    process: Process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_marked_down(self, shard_index: int, timeout_s: float = 60.0) -> None:
        """Until the balancer has taken the shard (1-based, as the config names it) out.
        HAProxy's health check says so in its log; nginx (without NGINX Plus) has no active
        check and skips a shard on its first refused connection, so there is nothing to wait for."""
        if self.kind != "haproxy":
            return
        marked = f"shards/shard{shard_index} is DOWN"
        assert wait_until(lambda: marked in self.process.output(), timeout=timeout_s), self.process.output()[-2000:]


def start_balancer(kind: str, shards: Sequence[Shard], root: Path, stack: ExitStack) -> Balancer:
    """The shipped config of ``kind`` for these shards, run in the foreground until the end."""
    binary = require_balancer(kind)
    port = free_port()
    shard_ports = [s.port for s in shards]
    folder = root / kind
    folder.mkdir()
    if kind == "haproxy":
        config = folder / "haproxy.cfg"
        config.write_text(render_haproxy((EXAMPLES / "haproxy.cfg").read_text(), port, shard_ports))
        return _run_balancer(kind, [binary, "-f", str(config), "-db"], port, root, stack)
    config = folder / "nginx.conf"
    config.write_text(render_nginx((EXAMPLES / "nginx.conf").read_text(), port, shard_ports))
    argv = [binary, "-p", str(folder), "-c", str(config), "-e", "stderr"]
    if os.geteuid() == 0:
        # Started by root (a CI container), nginx's workers would switch to nobody, who
        # cannot reach the temporary folders under the test's private folder.
        argv += ["-g", "user root;"]
    return _run_balancer(kind, argv, port, root, stack)


def start_haproxy_standby(shards: Sequence[PairedShard], root: Path, stack: ExitStack) -> Balancer:
    """``examples/haproxy-standby.cfg`` for these shards, run in the foreground until the end."""
    binary = require_balancer("haproxy")
    port = free_port()
    gateway_ports = [[urlsplit(g.url).port or 0 for g in s.pair.started] for s in shards]
    config = root / "haproxy-standby.cfg"
    text = (EXAMPLES / "haproxy-standby.cfg").read_text()
    config.write_text(render_haproxy_standby(text, port, [free_port() for _ in shards], gateway_ports))
    return _run_balancer("haproxy", [binary, "-f", str(config), "-db"], port, root, stack)


def _run_balancer(kind: str, argv: list[str], port: int, root: Path, stack: ExitStack) -> Balancer:
    """``argv`` in the foreground until the end, once it answers ``/healthz`` on ``port``."""
    process = Process(argv, root / f"{kind}.log")
    stack.callback(process.stop)
    balancer = Balancer(kind, port, process)
    wait_http(balancer.url + "/healthz", timeout_s=60, process=process.proc)
    return balancer


@dataclass
class Sharded:
    """Shards and the balancer in front of them."""

    balancer: Balancer
    shards: Sequence[Shard | PairedShard]

    def placement(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Each program's ``(tool_calls, llm_calls)`` in the store of every shard that has it."""
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for shard in self.shards:
            for pid, summary in shard.programs().items():
                out.setdefault(pid, {})[shard.name] = (summary.tool_calls, summary.llm_calls)
        return out


def start_sharded(kind: str, count: int, root: Path, stack: ExitStack, *, time_scale: float = 50.0) -> Sharded:
    """``count`` shards of two workers each behind the shipped config of ``kind``."""
    shards = start_shards(count, root, stack, time_scale=time_scale)
    return Sharded(start_balancer(kind, shards, root, stack), shards)


def start_paired_sharded(
    count: int, schema_url: Callable[[], str], root: Path, stack: ExitStack, *, time_scale: float = 50.0
) -> Sharded:
    """``count`` shards of two workers and a holder and a standby each (``start_paired_shards``)
    behind ``examples/haproxy-standby.cfg``."""
    shards = start_paired_shards(count, schema_url, root, stack, time_scale=time_scale)
    return Sharded(start_haproxy_standby(shards, root, stack), shards)
