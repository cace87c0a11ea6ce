"""A standby per shard: two ``maitred serve --shard s1`` on one PostgreSQL store and two
simulated workers; exactly one serves, the other answers 503 until the holder dies, then takes
over. And the lease itself (``ShardLease``) on the real PostgreSQL: one holder per shard and
schema, and a holder whose session is ended knows it lost the lease."""

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from maitred.gateway.lease import ShardLease
from maitred.harness.background import free_port, wait_http
from maitred.harness.standby import ShardPair, chat, takeover
from maitred.storage import SessionStore
from tests.conftest import POSTGRES_URL
from tests.helpers import TcpProxy, wait_until


@pytest.fixture
def leases() -> Iterator[Callable[..., ShardLease]]:
    """``leases(url, shard, label)``: a ShardLease, closed at the end."""
    with ExitStack() as stack:

        def make(url: str, shard: str, label: str) -> ShardLease:
            lease = ShardLease(url, shard, label=label)
            stack.callback(lease.close)
            return lease

        yield make


@pytest.fixture
def workers() -> Iterator[list[str]]:
    """Two simulated workers, stopped at the end."""
    with ExitStack() as stack:
        urls = []
        for _ in range(2):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "maitred.sim.worker", "--port", str(port), "--gpu-tokens", "400000"])
            stack.callback(lambda p=proc: (p.kill(), p.wait()))
            urls.append(f"http://127.0.0.1:{port}")
            wait_http(urls[-1] + "/health", timeout_s=60, process=proc)
        yield urls


# -- the lease ----------------------------------------------------------------------------------


def test_two_gateways_of_one_shard_get_one_lease_and_the_other_names_the_holder(schema_url, leases):
    url = schema_url()
    first, second = leases(url, "s1", "maitred shard=s1 first"), leases(url, "s1", "maitred shard=s1 second")
    assert first.try_acquire() and not second.try_acquire()
    assert second.holder() == "maitred shard=s1 first" and first.check()
    first.close()
    assert second.try_acquire() and second.holder() == "maitred shard=s1 second"


def test_different_shards_and_the_same_shard_in_another_schema_do_not_contend(schema_url, leases):
    url, other_schema = schema_url(), schema_url()
    held = [leases(url, "s1", "a"), leases(url, "s2", "b"), leases(other_schema, "s1", "c")]
    assert [lease.try_acquire() for lease in held] == [True, True, True]


def test_a_holder_whose_session_is_ended_knows_it_lost_the_lease_and_another_takes_it(schema_url, leases):
    url = schema_url()
    holder, waiting = leases(url, "s1", "holder"), leases(url, "s1", "waiting")
    assert holder.try_acquire() and not waiting.try_acquire()
    admin = create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder.backend_pid}).scalar()
    admin.dispose()
    assert wait_until(lambda: not holder.check(), timeout=10)
    assert not holder.held and not holder.check()
    assert waiting.try_acquire() and waiting.holder() == "waiting"


# -- flags --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, says",
    [
        (["--shard", "s1", "--db", "sqlite:///{tmp}/x.db"], r"--shard: needs a PostgreSQL --db .* not sqlite"),
        (["--shard", "s1", "--no-db"], r"--shard: needs a PostgreSQL store .* not --no-db"),
        (["--lease-poll", "1", "--no-db"], r"--lease-poll: only with --shard"),
        (["--standby-hold", "10", "--no-db"], r"--standby-hold: only with --shard"),
        (["--shard", "s 1", "--no-db"], r"--shard: .* is not a shard name"),
        (["--shard", "s1", "--lease-poll", "0", "--no-db"], r"--lease-poll: must be a positive"),
    ],
)
def test_a_shard_without_a_postgresql_store_is_refused_naming_the_flags(tmp_path, args, says):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "maitred.gateway.serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert re.search(says, done.stderr) and "Traceback" not in done.stderr, done.stderr


# -- two gateways of one shard ------------------------------------------------------------------


def test_one_gateway_serves_the_other_stands_by_and_takes_over_when_the_holder_is_killed(schema_url, workers, tmp_path):
    url = schema_url()
    with ShardPair(url, workers, tmp_path, lease_poll_s=0.2) as pair:
        holder, [spare] = pair.holder(), pair.standbys()
        assert chat(holder.url, "p-before").status_code == 200
        tool = {"type": "tool.start", "ts": time.time(), "program_id": "p-before", "call_id": "c1", "tool": "pytest"}
        assert httpx.post(holder.url + "/v1/events", json=[tool], timeout=10).json()["accepted"] == 1
        before = httpx.get(holder.url + "/v1/programs/p-before", timeout=10).json()
        health = spare.health()
        assert health is not None and health.status_code == 503
        said = health.json()
        assert (said["shard"], said["role"]) == ("s1", "standby")
        assert re.fullmatch(rf"maitred shard=s1 pid={holder.proc.pid} 127\.0\.0\.1:\d+", said["lease_holder"]), said
        assert not any(said["workers"].values()), "a standby does not poll the workers"
        assert said["store"] is None, "a standby runs no store writer"
        for path, body in (("/v1/chat/completions", {"model": "m", "messages": []}), ("/v1/events", [])):
            refused = httpx.post(spare.url + path, json=body, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
            assert "standby for shard s1" in refused.json()["error"]["message"]
        held = holder.health()
        assert held is not None and (held.json()["role"], held.json()["lease_holder"]) == ("holder", said["lease_holder"])

        def stored() -> bool:
            with SessionStore(url) as store:
                return any(e["type"] == "tool.start" and e["program_id"] == "p-before" for e in store.events())

        assert stored(), "a holder answers an event POST once its events are in the store"
        seconds = takeover(pair, "p-after")
        assert pair.holder() is spare and seconds > 0
        after = httpx.get(spare.url + "/v1/programs/p-before", timeout=10).json()  # restored from the store
        assert (after["worker"], after["tool"]["call_id"]) == (before["worker"], "c1")
        now = spare.health()
        assert now is not None and now.json()["role"] == "holder"
        metrics = httpx.get(spare.url + "/metrics", timeout=10).text
        assert 'maitred_shard_role{role="holder",shard="s1"} 1.0' in metrics
        assert 'maitred_shard_role{role="standby",shard="s1"} 0.0' in metrics
        assert re.search(r'^maitred_takeover_seconds\{shard="s1"\} \d', metrics, re.M), metrics


def test_a_holder_whose_lease_session_ends_stops_serving_and_exits_and_the_standby_serves(schema_url, workers, tmp_path):
    url = schema_url()
    with ShardPair(url, workers, tmp_path, lease_poll_s=0.2) as pair:
        holder, [spare] = pair.holder(), pair.standbys()
        admin = create_engine(POSTGRES_URL)
        with admin.begin() as conn:
            ended = conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :name"),
                {"name": holder.health().json()["lease_holder"]},  # type: ignore[union-attr]
            ).all()
        admin.dispose()
        assert ended == [(True,)]
        assert holder.proc.wait(60) == 1
        assert "maitred serve: error: --shard s1: lease lost" in holder.log.read_text()
        assert pair.holder() is spare and chat(spare.url, "p-after").status_code == 200


def test_a_gateway_started_while_the_database_is_down_stands_by_and_serves_once_it_is_back(schema_url, workers, tmp_path):
    url = make_url(schema_url())
    database = TcpProxy(url.host or "127.0.0.1", url.port or 5432)  # not up yet: connections are refused
    pair = ShardPair(url.set(port=database.port).render_as_string(hide_password=False), workers, tmp_path, lease_poll_s=0.2)
    try:
        gateway = pair.start()
        health = gateway.health()
        assert health is not None and health.status_code == 503
        assert health.json()["role"] == "standby" and "cannot ask for the lease" in health.json()["status"]
        database.up()
        assert pair.holder() is gateway and chat(gateway.url, "p-late").status_code == 200
    finally:
        pair.close()
        database.down()


def test_a_standby_with_standby_hold_refuses_while_the_holder_lives_and_serves_a_request_sent_as_it_dies(
    schema_url, workers, tmp_path
):
    """``--standby-hold 600``: with the holder alive, the standby's next tries of the lease say
    so and it refuses (long before the hold or the client's timeout would end); a request sent
    to it the moment the holder is killed is held through the takeover and served."""
    with ShardPair(schema_url(), workers, tmp_path, lease_poll_s=0.2, standby_hold_s=600) as pair:
        holder, [spare] = pair.holder(), pair.standbys()
        refused = chat(spare.url, "p-refused")
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        holder.proc.kill()
        holder.proc.wait()
        served = chat(spare.url, "p-held")
        assert served.status_code == 200, served.text
        assert pair.holder() is spare
