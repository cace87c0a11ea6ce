"""The load the scale tests put on shards through a balancer: programs whose model calls and tool
events go through it, half on the OpenAI chat route with ``X-Program-Id``, half on the Anthropic
messages route, streamed, with only ``x-claude-code-session-id``, as Claude Code does; their
events through maitred's own emitter. ``settle`` reads back where each program's calls were stored."""

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

import maitred
from tests.helpers import wait_until
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


def programs(count: int = PROGRAMS) -> list[Program]:
    """Ids shaped as each client makes them: maitred-style names and Claude Code's session UUIDs."""
    return [Program(f"agent-{i:02d}", "openai") if i % 2 else Program(str(uuid.uuid4()), "anthropic") for i in range(count)]


def model_call(client: httpx.Client, url: str, program: Program, step: int) -> str | None:
    """One model call through the balancer; the problem (an error answer, or a connection or
    stream that failed), or None when it was answered in full."""
    content = f"{CONTEXT}step {step} of {program.program_id}"
    try:
        if program.api == "openai":
            body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
            r = client.post(url + "/v1/chat/completions", json=body, headers={"x-program-id": program.program_id})
            text, done = r.text, r.status_code == 200 and bool(r.json()["choices"])
        else:
            body = {"model": "m", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": content}]}
            headers = {"x-claude-code-session-id": program.program_id, "anthropic-version": "2023-06-01"}
            with client.stream("POST", url + "/v1/messages", json=body, headers=headers) as r:
                text = r.read().decode()
            done = r.status_code == 200 and "message_stop" in text
    except httpx.HTTPError as exc:
        return f"{program.program_id}: {type(exc).__name__}: {exc}"
    return None if done else f"{program.program_id}: {r.status_code} {text[:200]}"


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
