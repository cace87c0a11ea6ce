"""A shard without a standby killed outright (its gateway and its workers, SIGKILL) behind the
balancer running the shipped config: each of its programs is re-homed on a survivor at the cost
of one recompute, its next call there, and is served from that shard's cache from then on; the
programs of the other shards lose nothing.

The programs are conversations (``tests/scale/conversations.py``): each call sends the whole
history, so what a call cost is read from the simulated worker's own report of the prompt tokens
it had cached; where it was served, from the store of the shard that answered it. The calls
right after the kill reach the balancer before its health check can have failed: each is refused
by the dead shard and retried on another, and must land where the programs' later calls land
once the check has taken the shard out (HAProxy's shipped config marks a shard down on its
first refused connection for that; nginx takes it out on its first refusal anyway)."""

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.scale.conversations import Conversations, answered_by
from tests.scale.harness import BALANCERS, Shard, Sharded, require_balancer, start_sharded

SHARDS = 3
PROGRAMS = 12
BEFORE = 3  # turns of every program before the kill
RIGHT_AFTER = 1  # turns right after it, before the balancer has marked the shard down
AFTER = 3  # turns once it has


@pytest.fixture(params=BALANCERS)
def three(request: pytest.FixtureRequest, tmp_path) -> Iterator[Sharded]:
    require_balancer(request.param)
    with ExitStack() as stack:
        yield start_sharded(request.param, SHARDS, tmp_path, stack)


def test_the_programs_of_a_killed_shard_are_rehomed_with_one_recompute_each(three: Sharded) -> None:
    url = three.balancer.url
    convs = Conversations([f"conv-{i:02d}" for i in range(PROGRAMS)])
    assert convs.run(url, BEFORE) == []
    served = answered_by(three, convs)
    home = {pid: served[f"{pid}.0"].shard for pid in convs.program_ids}
    victim = three.shards[0]
    assert isinstance(victim, Shard)
    moved = {pid for pid, shard in home.items() if shard == victim.name}
    assert moved and len(moved) < PROGRAMS, home  # the hash gives the victim some programs, not all

    # Before the kill: every program on one shard and one worker, a recompute only at its start.
    before = range(BEFORE)
    assert {pid: convs.recomputes(pid, before) for pid in convs.program_ids} == {pid: [] for pid in convs.program_ids}
    for pid in convs.program_ids:
        assert len({(served[f"{pid}.{t}"].shard, served[f"{pid}.{t}"].worker) for t in before}) == 1, (pid, served)

    victim.kill()
    assert convs.run(url, RIGHT_AFTER) == []
    three.balancer.wait_marked_down(1)
    assert convs.run(url, AFTER) == []

    served = answered_by(three, convs)
    after = range(BEFORE, BEFORE + RIGHT_AFTER + AFTER)
    seen = {pid: [(served[t.request_id].shard, t.cached_tokens) for t in convs.turns[pid]] for pid in moved}
    # One recompute per moved program, its first call on its new shard; none for the others.
    recomputes = {pid: convs.recomputes(pid, after) for pid in convs.program_ids}
    assert recomputes == {pid: [BEFORE] if pid in moved else [] for pid in convs.program_ids}, seen
    for pid in convs.program_ids:
        places = {(served[f"{pid}.{t}"].shard, served[f"{pid}.{t}"].worker) for t in after}
        assert len(places) == 1, (pid, places)  # one survivor, one of its workers, from the first call on
        [(shard, _)] = places
        assert shard != victim.name and (pid in moved or shard == home[pid]), (pid, home[pid], shard)
        # The survivors' stores agree with what their workers told the clients.
        for t in convs.turns[pid][BEFORE:]:
            assert served[t.request_id].cached_tokens == t.cached_tokens, (t, served[t.request_id])
