"""Two shards, each a holder and a standby (``maitred serve --shard``) on its own two workers and
PostgreSQL schema, behind HAProxy running ``examples/haproxy-standby.cfg`` as shipped but for its
ports: one shard's holder is killed with SIGKILL while programs keep calling, and no client sees
an error but for a stream the holder had begun answering (which no balancer can send again);
every program stays on its shard, the standby takes over, and every model call and tool event
of the run is in its shard's store exactly once.

The load is ``tests/scale/load.py``'s (streamed and plain model calls, tool events through
maitred's own emitter), round after round in a thread; the kill comes once the stores hold a
round and a half of model calls."""

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

import maitred
from tests.helpers import wait_until
from tests.scale.harness import PairedShard, Sharded, require_balancer, start_paired_sharded
from tests.scale.load import MODEL_CALLS, ROUND, programs, run_round, settle

SHARDS = 2
#: How httpx reports a stream whose server went away after the answer began.
CUT_STREAM = "incomplete chunked read"
PROGRAMS = 20
ROUNDS = 5


@pytest.fixture
def paired(schema_url: Callable[[], str], tmp_path) -> Iterator[Sharded]:
    require_balancer("haproxy")
    with ExitStack() as stack:
        yield start_paired_sharded(SHARDS, schema_url, tmp_path, stack)


def stored_model_calls(sharded: Sharded) -> int:
    return sum(n for homes in sharded.placement().values() for _, n in homes.values())


def test_a_holder_killed_under_load_is_replaced_by_its_standby_without_a_client_error(
    paired: Sharded, warnings: list[str]
) -> None:
    batch = programs(PROGRAMS)
    url = paired.balancer.url
    maitred.configure(runtime_url=url)
    victim = paired.shards[0]
    assert isinstance(victim, PairedShard)
    holder, [standby] = victim.pair.holder(), victim.pair.standbys()

    with ThreadPoolExecutor(1) as load:
        rounds = load.submit(lambda: [p for _ in range(ROUNDS) for p in run_round(url, batch)])
        mid_load = PROGRAMS * MODEL_CALLS * 3 // 2
        assert wait_until(lambda: stored_model_calls(paired) >= mid_load or rounds.done(), timeout=300, interval=0.1)
        assert not rounds.done(), "the load ended before the kill: raise ROUNDS"
        holder.proc.kill()
        holder.proc.wait()
        problems = rounds.result()

    # A stream the holder had begun answering when it was killed cannot be sent again (HAProxy
    # retries only what got no answer yet): its client sees the stream cut, as without a
    # balancer. Every other request is answered.
    cut = [p for p in problems if CUT_STREAM in p]
    assert [p for p in problems if CUT_STREAM not in p] == []
    assert victim.pair.holder() is standby
    cut_pids = {p.split(":", 1)[0] for p in cut}
    every = (ROUNDS * ROUND[0], ROUNDS * ROUND[1])
    placed = settle(paired, {p.program_id: every for p in batch if p.program_id not in cut_pids})
    assert {pid: len(homes) for pid, homes in placed.items()} == {p.program_id: 1 for p in batch}, placed
    assert {name for homes in placed.values() for name in homes} == {s.name for s in paired.shards}
    for pid in cut_pids:
        # A cut stream was recorded before its end was sent (the holder answers only for what is
        # stored), unless the kill came before the record was written: one call less then.
        [(shard, (tools, calls))] = placed[pid].items()
        assert shard == victim.name and tools == every[0] and every[1] - 1 <= calls <= every[1], (pid, placed[pid])
    assert warnings == []
