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
first refused connection for that; nginx takes it out on its first refusal anyway).

A call the dead shard was answering when it died cannot be saved: it was sent already, and
neither shipped config sends a request on to another shard once it went out (a model call is
not idempotent). Its client is told at once, by the balancer's 502, and the program's next call
is re-homed like the others: one recompute, not two."""

import threading
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.helpers import wait_until
from tests.scale.conversations import Conversations, answered_by
from tests.scale.harness import BALANCERS, Shard, Sharded, require_balancer, start_sharded

SHARDS = 3
PROGRAMS = 12
BEFORE = 3  # turns of every program before the kill
RIGHT_AFTER = 1  # turns right after it, before the balancer has marked the shard down
AFTER = 3  # turns once it has
#: Tokens of the call in flight at the kill: about 5 s of decoding on these workers.
LONG_CALL_TOKENS = 40_000


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


def test_a_call_in_flight_when_its_shard_dies_fails_at_once_and_costs_its_program_one_recompute(three: Sharded) -> None:
    url = three.balancer.url
    convs = Conversations([f"mid-{i:02d}" for i in range(PROGRAMS)])
    assert convs.run(url, BEFORE) == []
    served = answered_by(three, convs)
    victim = three.shards[0]
    assert isinstance(victim, Shard)
    caught = sorted(pid for pid in convs.program_ids if served[f"{pid}.0"].shard == victim.name)[0]

    # One more call of ``caught``, long enough to be running on the victim's worker when it dies
    # (the same history: a call that fails adds no turn to it).
    long = Conversations([caught], max_tokens=LONG_CALL_TOKENS, history=convs.history, turns=convs.turns)
    in_flight = threading.Thread(target=long.run, args=(url, 1))
    in_flight.start()

    def generating() -> bool:
        r = httpx.get(f"{victim.url}/v1/programs/{caught}", timeout=5)
        return r.status_code == 200 and r.json()["phase"] == "reasoning"

    assert wait_until(generating, timeout=30, interval=0.05)
    victim.kill()
    in_flight.join(timeout=60)
    assert not in_flight.is_alive()  # the client was told; it did not wait out its timeout
    [problem] = long.problems
    assert problem.startswith(f"{caught} turn {BEFORE}: 502"), problem

    three.balancer.wait_marked_down(1)
    assert convs.run(url, AFTER) == []
    served = answered_by(three, convs)
    after = range(BEFORE, BEFORE + AFTER)
    assert convs.recomputes(caught, after) == [BEFORE]  # the call re-sent on a survivor, and only it
    places = {(served[f"{caught}.{t}"].shard, served[f"{caught}.{t}"].worker) for t in after}
    assert len(places) == 1 and victim.name not in {shard for shard, _ in places}, places
