"""Messages between shards on the real PostgreSQL: two ``maitred serve --shard a|b`` on one
store, each with its own simulated worker. A program served by shard a whose next request
reaches shard b is dropped by shard a at once (not after its TTL), and counted; with the
link's session terminated meanwhile, the catch-up after its reconnect still drops it.

Every process is real and on 127.0.0.1, stopped at the end also when a test fails; every wait
is a poll with a generous bound, never a check of speed."""

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from maitred.gateway.metrics import Metrics
from maitred.gateway.shard_link import ShardLink
from maitred.harness.background import free_port, wait_http
from maitred.harness.standby import chat
from maitred.storage import SessionStore
from tests.conftest import POSTGRES_URL
from tests.helpers import throwaway_schemas, wait_until
from tests.scale.harness import Process, maitred_command

#: How long a poll waits for what should follow within a second on a quiet machine.
BOUND_S = 60.0


@dataclass
class Gateway:
    name: str
    url: str
    db_url: str
    worker: str
    process: Process

    def serves(self, program_id: str) -> bool:
        """Whether its live state holds ``program_id`` (``GET /v1/programs/<id>``: 200, else 404)."""
        status = httpx.get(f"{self.url}/v1/programs/{program_id}", timeout=10).status_code
        assert status in (200, 404), status
        return status == 200

    def metric(self, name: str) -> float:
        """One sample of ``/metrics``, its labels written as Prometheus prints them; 0 when absent."""
        body = httpx.get(self.url + "/metrics", timeout=10).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", body, flags=re.MULTILINE)
        return float(found[1]) if found else 0.0


def start_shard(name: str, db_url: str, root: Path, stack: ExitStack) -> Gateway:
    """``maitred serve --shard NAME`` on ``db_url`` with one simulated worker of its own."""
    worker_port = free_port()
    worker = Process(
        maitred_command("sim-worker", "--port", str(worker_port), "--log-level", "warning"), root / f"{name}-worker.log"
    )
    stack.callback(worker.stop)
    wait_http(f"http://127.0.0.1:{worker_port}/health", timeout_s=120, process=worker.proc)
    return start_gateway(name, db_url, f"http://127.0.0.1:{worker_port}", root / f"{name}-serve.log", stack)


def start_gateway(name: str, db_url: str, worker: str, log: Path, stack: ExitStack) -> Gateway:
    """``maitred serve --shard NAME`` on ``db_url`` in front of ``worker``."""
    port = free_port()
    argv = maitred_command("serve", "--port", str(port), "--db", db_url, "--shard", name, "--tick", "0.2")
    argv += ["--worker", worker, "--log-level", "info"]
    gateway = Process(argv, log)
    stack.callback(gateway.stop)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", timeout_s=120, process=gateway.proc)
    return Gateway(name, url, db_url, worker, gateway)


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def shards(tmp_path, stack) -> Iterator[tuple[Gateway, Gateway]]:
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "xshard") as make, ExitStack() as own:
        url = make()
        yield start_shard("a", url, tmp_path, own), start_shard("b", url, tmp_path, own)


def _moves_counted(gateway: Gateway, n: int) -> bool:
    return gateway.metric("maitred_programs_moved_away_total") >= n


def test_a_program_whose_next_request_reaches_another_shard_is_dropped_by_the_first_at_once(shards):
    a, b = shards
    assert chat(a.url, "p-moved").status_code == 200
    assert chat(a.url, "p-stays").status_code == 200
    assert a.serves("p-moved") and a.serves("p-stays")
    assert chat(b.url, "p-moved").status_code == 200  # the balancer sent it to shard b now
    assert wait_until(lambda: not a.serves("p-moved"), timeout=BOUND_S), a.process.output()[-3000:]
    assert b.serves("p-moved") and a.serves("p-stays")
    assert wait_until(lambda: _moves_counted(a, 1), timeout=BOUND_S)
    assert a.metric('maitred_shard_messages_total{direction="received",kind="moved"}') == 1
    assert b.metric('maitred_shard_messages_total{direction="sent",kind="moved"}') == 1
    assert b.metric("maitred_programs_moved_away_total") == 0
    # ... and back: shard a claims it again, and shard b lets it go.
    assert chat(a.url, "p-moved").status_code == 200
    assert wait_until(lambda: not b.serves("p-moved"), timeout=BOUND_S), b.process.output()[-3000:]
    assert a.serves("p-moved") and _moves_counted(b, 1)


def test_a_move_made_while_the_listener_was_cut_off_is_caught_up_after_it_reconnects(shards):
    a, b = shards
    assert chat(a.url, "p-before").status_code == 200
    assert chat(a.url, "p-during").status_code == 200
    # Shard a's claims are written (a claim still queued when the link breaks is written after
    # its reconnect, and then it is shard b that lets the program go).
    assert wait_until(lambda: _home(a.db_url, "p-before") == _home(a.db_url, "p-during") == "a", timeout=BOUND_S)
    admin = create_engine(POSTGRES_URL)
    try:
        label = f"maitred shard=a pid={a.process.proc.pid} messages"
        find = text("SELECT pid FROM pg_stat_activity WHERE application_name = :label")
        with admin.begin() as conn:
            backends = list(conn.execute(find, {"label": label}).scalars())
            assert len(backends) == 1, backends
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backends[0]}).scalar()
        # Shard b claims the program before shard a's link can be listening again (its first
        # retry waits 0.2 s); were it already back, the NOTIFY itself drops it: the same end.
        assert chat(b.url, "p-during").status_code == 200
        assert wait_until(lambda: not a.serves("p-during"), timeout=BOUND_S), a.process.output()[-3000:]
        assert a.serves("p-before") and _moves_counted(a, 1)

        def reconnected() -> bool:
            with admin.begin() as conn:
                return len(list(conn.execute(find, {"label": label}).scalars())) == 1

        assert wait_until(reconnected, timeout=BOUND_S)
    finally:
        admin.dispose()
    assert "cross-shard messages interrupted" in a.process.output()
    assert chat(b.url, "p-before").status_code == 200  # and the new session hears the next move
    assert wait_until(lambda: not a.serves("p-before"), timeout=BOUND_S), a.process.output()[-3000:]


def test_a_shard_back_from_down_drops_the_programs_another_shard_took_meanwhile(shards, tmp_path, stack):
    a, b = shards
    assert chat(a.url, "p-away").status_code == 200 and chat(a.url, "p-kept").status_code == 200
    assert wait_until(lambda: _home(a.db_url, "p-away") == _home(a.db_url, "p-kept") == "a", timeout=BOUND_S)
    a.process.stop()
    assert chat(b.url, "p-away").status_code == 200  # the balancer sent it to shard b while a was down
    assert wait_until(lambda: _home(b.db_url, "p-away") == "b", timeout=BOUND_S)
    back = start_gateway("a", a.db_url, a.worker, tmp_path / "a-back-serve.log", stack)
    assert wait_until(lambda: not back.serves("p-away"), timeout=BOUND_S), back.process.output()[-3000:]
    assert back.serves("p-kept"), "restored from the store, and no other shard took it"
    assert chat(back.url, "p-away").status_code == 200  # ... and the balancer sends it back to a
    assert wait_until(lambda: not b.serves("p-away"), timeout=BOUND_S), b.process.output()[-3000:]


# -- the link itself, in this process -----------------------------------------------------------


@pytest.fixture
def links() -> Iterator[tuple[str, Callable[..., tuple[ShardLink, list[str]]]]]:
    """A fresh schema's URL, and ``link(shard, **options)``: a ShardLink there (closed at the
    end) and the programs it was told moved away, in order."""
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "xlink") as make, ExitStack() as stack:
        url = make()
        SessionStore(url).close()  # the schema, migrated

        def link(shard: str, **options: float) -> tuple[ShardLink, list[str]]:
            told: list[str] = []
            made = ShardLink(url, shard, on_moved_away=told.append, metrics=Metrics(), **options)
            stack.callback(made.close)
            return made, told

        yield url, link


def _home(url: str, program_id: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT shard FROM program_homes WHERE program_id = :p"), {"p": program_id}).scalar()
    finally:
        engine.dispose()


def _received(link: ShardLink) -> float:
    return link.metrics.shard_messages.labels("received", "moved")._value.get()


def test_a_claim_tells_the_shard_the_program_left_and_only_that_shard(links):
    url, link = links
    a, told_a = link("a")
    b, told_b = link("b")
    c, told_c = link("c")
    a.claim("p1")
    assert wait_until(lambda: _home(url, "p1") == "a", timeout=BOUND_S)
    b.claim("p1")
    assert wait_until(lambda: told_a == ["p1"], timeout=BOUND_S)
    assert _home(url, "p1") == "b" and told_b == [] and told_c == [] and _received(c) == 0
    b.claim("p1")  # already its home: nothing moves, nobody is told
    c.claim("p2")
    assert wait_until(lambda: _home(url, "p2") == "c", timeout=BOUND_S)
    assert told_a == ["p1"] and told_b == [] and told_c == []


def test_moves_missed_while_the_link_was_disconnected_are_caught_up_on_reconnect(links):
    url, link = links
    a, told_a = link("a", retry_s=3.0, heartbeat_s=0.2)  # a window with nobody listening for shard a
    b, _ = link("b")
    a.claim("p-missed")
    assert wait_until(lambda: _home(url, "p-missed") == "a" and a.last_seen is not None, timeout=BOUND_S)
    admin = create_engine(POSTGRES_URL)
    find = text("SELECT pid FROM pg_stat_activity WHERE application_name = :label")
    try:
        with admin.begin() as conn:
            [backend] = conn.execute(find, {"label": a.label}).scalars()
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend}).scalar()

        def listening() -> int:
            with admin.begin() as conn:
                return len(list(conn.execute(find, {"label": a.label}).scalars()))

        assert wait_until(lambda: listening() == 0, timeout=BOUND_S)
        b.claim("p-missed")
        assert wait_until(lambda: _home(url, "p-missed") == "b", timeout=BOUND_S)
        assert listening() == 0 and told_a == [], "shard a was not listening when the program moved"
        assert wait_until(lambda: told_a == ["p-missed"], timeout=BOUND_S)
        assert _received(a) == 0, "told by the catch-up, not by the message it missed"
    finally:
        admin.dispose()


def test_a_move_older_than_a_claim_still_queued_does_not_drop_the_program(links):
    url, link = links
    a, told_a = link("a", retry_s=3.0)
    b, _ = link("b")
    a.claim("p")
    assert wait_until(lambda: _home(url, "p") == "a" and a.last_seen is not None, timeout=BOUND_S)
    admin = create_engine(POSTGRES_URL)
    try:
        with admin.begin() as conn:
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :l"), {"l": a.label}
            )
    finally:
        admin.dispose()
    b.claim("p")
    assert wait_until(lambda: _home(url, "p") == "b", timeout=BOUND_S)
    a.claim("p")  # the program came back to shard a before its link reconnected
    assert wait_until(lambda: _home(url, "p") == "a", timeout=BOUND_S)
    assert told_a == [], "the catch-up found the move, but shard a's own claim is newer"


def test_a_move_in_another_schema_of_the_same_database_is_not_ours(links):
    url, link = links
    a, told_a = link("a")
    b, _ = link("b")
    with throwaway_schemas(POSTGRES_URL, "xother") as make:
        other = make()
        SessionStore(other).close()
        elsewhere_told: list[str] = []
        a_elsewhere = ShardLink(other, "a", on_moved_away=elsewhere_told.append, metrics=Metrics())
        try:
            a.claim("p")
            a_elsewhere.claim("p")
            assert wait_until(lambda: _home(url, "p") == "a" and _home(other, "p") == "a", timeout=BOUND_S)
            b.claim("p")
            assert wait_until(lambda: told_a == ["p"], timeout=BOUND_S)
            assert wait_until(lambda: a_elsewhere.last_seen is not None, timeout=BOUND_S)
            for later in ("q", "r"):  # its link listened between writing these two claims
                a_elsewhere.claim(later)
                assert wait_until(lambda pid=later: _home(other, pid) == "a", timeout=BOUND_S)
            assert elsewhere_told == [] and _received(a_elsewhere) == 0
        finally:
            a_elsewhere.close()
