"""Shards behind HAProxy and nginx running the configs in ``examples/`` (``tests/scale/harness.py``):
every program's model calls and events reach one shard only, every shard gets programs, and a
shard that stops has its programs taken by the others without a client seeing an error.

Half the programs call the OpenAI chat route with ``X-Program-Id``; the other half call the
Anthropic messages route, streamed, with only ``x-claude-code-session-id``, as Claude Code does.
Both kinds send their tool events through maitred's own emitter (``maitred.configure(runtime_url=...)``:
the HTTP sink, one POST per program with its ``X-Program-Id``). Where a program landed is read
from each shard's store, as ``maitred programs --db`` shows it."""

import logging
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

import maitred
from tests.helpers import Warnings, wait_until
from tests.scale.harness import Sharded

PROGRAMS = 32
#: An agent's prompt is tens of KB: more than nginx keeps in memory (client_body_buffer_size,
#: 16 KiB), so the shipped config's temporary folders are used too.
CONTEXT = "src/app.py: def main() -> None: ...\n" * 700
MODEL_CALLS = 2  # per program and round, around one tool call
ROUND = (1, MODEL_CALLS)  # (tool_calls, llm_calls) one round leaves in a program's store


@dataclass(frozen=True)
class Program:
    program_id: str
    api: str  # "openai" (X-Program-Id) or "anthropic" (x-claude-code-session-id only)


def programs() -> list[Program]:
    """Ids shaped as each client makes them: maitred-style names and Claude Code's session UUIDs."""
    return [Program(f"agent-{i:02d}", "openai") if i % 2 else Program(str(uuid.uuid4()), "anthropic") for i in range(PROGRAMS)]


def model_call(client: httpx.Client, url: str, program: Program, step: int) -> str | None:
    """One model call through the balancer; the problem, or None when it was answered in full."""
    content = f"{CONTEXT}step {step} of {program.program_id}"
    if program.api == "openai":
        body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
        r = client.post(url + "/v1/chat/completions", json=body, headers={"x-program-id": program.program_id})
        return None if r.status_code == 200 and r.json()["choices"] else f"{program.program_id}: {r.status_code} {r.text[:200]}"
    body = {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": content}]}
    headers = {"x-claude-code-session-id": program.program_id, "anthropic-version": "2023-06-01"}
    with client.stream("POST", url + "/v1/messages", json=body, headers=headers) as r:
        text = r.read().decode()
    return None if r.status_code == 200 and "message_stop" in text else f"{program.program_id}: {r.status_code} {text[:200]}"


def run_round(url: str, batch: list[Program]) -> list[str]:
    """Every program once (eight at a time): a model call, a tool call, a model call, inside
    ``maitred.program``; then the emitter flushed. Returns every problem a client saw."""
    tool = maitred.tool(name="pytest")(lambda: "12 passed")

    def one(program: Program) -> list[str]:
        problems = []
        with maitred.program(program.program_id, agent="coder"):
            for step in range(MODEL_CALLS):
                if step:
                    tool()
                problems.append(model_call(client, url, program, step))
        return [p for p in problems if p is not None]

    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
        problems = [p for found in pool.map(one, batch) for p in found]
    if not maitred.flush(timeout=30):
        problems.append(f"events not all delivered: {maitred.stats()}")
    return problems


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The warnings the emitter gives (a refused or failed event POST is one)."""
    handler = Warnings()
    logging.getLogger("maitred").addHandler(handler)
    yield handler.messages
    logging.getLogger("maitred").removeHandler(handler)


def settle(sharded: Sharded, expected: dict[str, tuple[int, int]]) -> dict[str, dict[str, tuple[int, int]]]:
    """Each program's placement once the shards' stores hold ``expected`` calls of it, summed
    over the shards (a gateway writes its history a moment after answering)."""

    def total(found: dict[str, tuple[int, int]]) -> tuple[int, int]:
        return sum(t for t, _ in found.values()), sum(n for _, n in found.values())

    def done() -> bool:
        placed = sharded.placement()
        return all(total(placed.get(pid, {})) == counts for pid, counts in expected.items())

    settled = wait_until(done, timeout=60, interval=0.5)
    placed = sharded.placement()
    assert settled, {pid: placed.get(pid) for pid, counts in expected.items() if total(placed.get(pid, {})) != counts}
    return placed


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
