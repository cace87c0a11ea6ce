"""Programs as conversations through a balancer, and what each of their model calls cost the
workers' prefix caches: for measuring what a killed shard costs the programs it served.

Every program sends its whole history each turn (its earlier messages and the model's answers),
as an agent does, so a call that reaches the worker that answered the program's previous call
is served from that worker's prefix cache: the simulated worker reports at least the previous
prompt's tokens as cached (``usage.prompt_tokens_details.cached_tokens``, SGLang's
``--enable-cache-report``). A call served with fewer is a *recompute*: its context was not
where the call landed. A program's very first call is a recompute by nature and is counted
apart, as its cold start.

Each call carries ``X-Maitred-Request-Id`` (``PROGRAM.TURN``), which the shard stores as the
call's request id, so every call is found again in the store of the shard that answered it,
with the worker that served it (``answered_by``)."""

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import httpx

from maitred.gateway.restore import GATEWAY_REQUEST_PREFIX
from maitred.storage import SessionStore
from tests.helpers import wait_until
from tests.scale.harness import Sharded

#: Words of each user message (the simulated worker counts one token per word).
USER_WORDS = 40


@dataclass
class Turn:
    """One model call of a program as its client saw it."""

    program_id: str
    turn: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def request_id(self) -> str:
        return f"{self.program_id}.{self.turn}"


@dataclass
class Conversations:
    """Programs' histories and every answered call, turn after turn; ``problems``: every call
    that was not answered with 200 and a usage report."""

    program_ids: Sequence[str]
    max_tokens: int = 8
    history: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    turns: dict[str, list[Turn]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)

    async def _one(self, client: httpx.AsyncClient, url: str, pid: str) -> None:
        messages = self.history.setdefault(pid, [])
        done = self.turns.setdefault(pid, [])
        turn = len(done)
        words = " ".join(f"{pid}-w{turn}-{i}" for i in range(USER_WORDS))
        body = {"model": "m", "max_tokens": self.max_tokens, "messages": [*messages, {"role": "user", "content": words}]}
        headers = {"x-program-id": pid, "x-maitred-request-id": f"{pid}.{turn}"}
        started = asyncio.get_running_loop().time()
        try:
            r = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
        except httpx.HTTPError as exc:
            self.problems.append(f"{pid} turn {turn}: {type(exc).__name__}: {exc}")
            return
        self.latencies.append(asyncio.get_running_loop().time() - started)
        if r.status_code != 200:
            self.problems.append(f"{pid} turn {turn}: {r.status_code} {r.text[:200]}")
            return
        answer = r.json()
        usage = answer["usage"]
        messages += [
            {"role": "user", "content": words},
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]},
        ]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        done.append(Turn(pid, turn, usage["prompt_tokens"], cached))

    async def _rounds(self, url: str, rounds: int, concurrency: int) -> None:
        gate = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:

            async def program(pid: str) -> None:
                async with gate:
                    for _ in range(rounds):
                        await self._one(client, url, pid)

            await asyncio.gather(*(program(pid) for pid in self.program_ids))

    def run(self, url: str, rounds: int, concurrency: int = 8) -> list[str]:
        """``rounds`` more turns of every program through ``url``, ``concurrency`` programs at a
        time, each program's turns in order; the problems of these rounds."""
        before = len(self.problems)
        asyncio.run(self._rounds(url, rounds, concurrency))
        return self.problems[before:]

    def recomputes(self, program_id: str, turns: Iterable[int]) -> list[int]:
        """Which of ``turns`` of the program (never its first, its cold start) were recomputes:
        served with fewer cached tokens than its previous prompt had."""
        done = self.turns[program_id]
        return [t for t in turns if 0 < t < len(done) and done[t].cached_tokens < done[t - 1].prompt_tokens]


@dataclass(frozen=True)
class Served:
    """Where a call was served, as the answering shard's store has it."""

    shard: str
    worker: str | None
    cached_tokens: int | None


def answered_by(sharded: Sharded, convs: Conversations, *, timeout_s: float = 60.0) -> dict[str, Served]:
    """Every answered call's shard and worker, by request id (``PROGRAM.TURN``), once every
    shard's store holds all of them, ends included (a shard writes its history a moment after
    answering, a call's start and its end not always in one batch)."""
    wanted = {t.request_id for turns in convs.turns.values() for t in turns}
    found: dict[str, Served] = {}

    def read() -> bool:
        found.clear()
        for shard in sharded.shards:
            with SessionStore(shard.db_url) as store:
                for pid in convs.program_ids:
                    timeline = store.program(pid)
                    for span in timeline.spans if timeline is not None else ():
                        rid = str(span.detail.get("request_id") or "").removeprefix(GATEWAY_REQUEST_PREFIX)
                        # a call whose end is not written yet names no worker: read again
                        if span.kind == "llm" and rid in wanted and span.detail.get("worker") is not None:
                            found[rid] = Served(shard.name, span.detail.get("worker"), span.detail.get("cached_tokens"))
        return wanted <= set(found)

    assert wait_until(read, timeout=timeout_s, interval=0.5), sorted(wanted - set(found))[:10]
    return found
