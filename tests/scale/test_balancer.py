"""Shards behind HAProxy and nginx running the configs in ``examples/`` (``tests/scale/harness.py``):
every program's model calls and events reach one shard only, every shard gets programs, and a
shard that stops has its programs taken by the others without a client seeing an error.

The programs are ``tests/scale/load.py``'s: half on the OpenAI chat route with ``X-Program-Id``,
half on the Anthropic messages route, streamed, with only ``x-claude-code-session-id``, as Claude
Code does, and their tool events through maitred's own emitter (``maitred.configure(runtime_url=...)``:
the HTTP sink, one POST per program with its ``X-Program-Id``). Where a program landed is read
from each shard's store, as ``maitred programs --db`` shows it."""

import maitred
from tests.scale.harness import Sharded
from tests.scale.load import ROUND, programs, run_round, settle


def test_every_program_lands_on_one_shard_and_every_shard_gets_programs(sharded: Sharded, warnings: list[str]) -> None:
    batch = programs()
    maitred.configure(runtime_url=sharded.balancer.url)

    assert run_round(sharded.balancer.url, batch) == []
    placed = settle(sharded, {p.program_id: ROUND for p in batch})

    assert {p.program_id: len(placed[p.program_id]) for p in batch} == {p.program_id: 1 for p in batch}
    assert {shard for shards in placed.values() for shard in shards} == {s.name for s in sharded.shards}
    assert warnings == []


def test_a_stopped_shard_is_taken_out_and_its_programs_move_to_the_others(sharded: Sharded, warnings: list[str]) -> None:
    batch = programs()
    maitred.configure(runtime_url=sharded.balancer.url)
    assert run_round(sharded.balancer.url, batch) == []
    first = {pid: next(iter(shards)) for pid, shards in settle(sharded, {p.program_id: ROUND for p in batch}).items()}
    stopped = sharded.shards[0]
    moved = {pid for pid, shard in first.items() if shard == stopped.name}
    assert moved, first

    stopped.gateway.stop()
    sharded.balancer.wait_marked_down(1)
    assert run_round(sharded.balancer.url, batch) == []

    twice = (2 * ROUND[0], 2 * ROUND[1])
    placed = settle(sharded, {pid: twice for pid in first})
    survivors = {s.name for s in sharded.shards[1:]}
    for pid, shards in placed.items():
        if pid in moved:
            # Its first round stays in the stopped shard's store; the second is on one survivor.
            on_survivors = {name: counts for name, counts in shards.items() if name != stopped.name}
            assert shards[stopped.name] == ROUND and len(on_survivors) == 1, (pid, shards)
            assert set(on_survivors) <= survivors and list(on_survivors.values()) == [ROUND], (pid, shards)
        else:
            assert shards == {first[pid]: twice}, (pid, shards)
    assert warnings == []
