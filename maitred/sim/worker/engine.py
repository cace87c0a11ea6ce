"""The simulated worker's clock and cache bookkeeping around the simulator's engine model.

``maitred.sim.engine.WorkerModel`` is an event-driven model of one SGLang worker (prefix cache with
sharing, eviction, host offload, continuous batching, a step-time model). Here it runs against
the wall clock: engine time = wall time since start × ``time_scale``, and one task sleeps until
the engine's next batch change (or a short streaming interval) and advances it.

The engine model thinks in programs and agents; an HTTP server sees only prompts. The
``ConversationIndex`` maps one onto the other the way a radix cache would see it: a request
continues the conversation whose cached sequence (previous prompt plus its output) it extends
— found through the hash chain of its 16-token pages, or for sequences shorter than a page
through their whole — and every other request starts a new one. Programs of one agent share
its prefix (system prompt and tool definitions). A request that only partly matches a
conversation (an edited history, two programs with the same first message) starts a new
conversation and is credited with the agent prefix only: the double under-reports such hits
rather than inventing ones a radix tree would not have.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from maitred.sim.engine import Request, WorkerModel
from maitred.sim.worker.tokens import Prompt

PAGE = 16
STREAM_INTERVAL_S = 0.02
#: The engine is advanced at most this often (wall seconds): at high time scales a batch changes
#: every few microseconds, and one wake-up catches up on all of them at once.
MIN_WAKE_S = 0.001
log = logging.getLogger(__name__)


class EngineFailed(RuntimeError):
    """The engine model raised; the worker answers 5xx (and ``/health`` 503) from then on."""


def _chain(ids: list[int]) -> list[int]:
    """One hash per full page, each covering everything before it."""
    return chain_from(ids, 0, 0)


def chain_from(ids: list[int], first_page: int, before: int) -> list[int]:
    """The page hashes of ``ids`` from page ``first_page`` on, ``before`` being the hash of the
    page ahead of it (0 at the root)."""
    out = []
    h = before
    for start in range(first_page * PAGE, len(ids) - PAGE + 1, PAGE):
        h = hash((h, tuple(ids[start : start + PAGE])))
        out.append(h)
    return out


def _short(ids: list[int]) -> int:
    """Key of a whole sequence shorter than a page (page hashes cannot see it)."""
    return hash(("short", tuple(ids)))


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    start = 0
    while a[start : start + PAGE] == b[start : start + PAGE]:
        start += PAGE
    while a[start] == b[start]:
        start += 1
    return start


@dataclass(slots=True)
class Conversation:
    agent: str
    tokens: list[int]


class ConversationIndex:
    """Prompt → engine program key, by longest cached prefix (see the module docstring)."""

    def __init__(self) -> None:
        self._owner: dict[int, str] = {}
        self._convs: dict[str, Conversation] = {}
        self._made = 0
        self.tokens_held = 0  # over all recorded sequences: what this index costs in memory

    def __len__(self) -> int:
        return len(self._convs)

    def resolve(self, prompt: Prompt, busy: Container[str]) -> str:
        ids = prompt.ids
        keys = [self._owner.get(h) for h in reversed(_chain(ids))]
        if not any(keys):  # perhaps a conversation shorter than a page: try the request's short prefixes
            keys = [self._owner.get(_short(ids[:n])) for n in range(min(len(ids), PAGE - 1), 0, -1)]
        for key in keys:
            conv = self._convs.get(key) if key is not None else None
            if key is None or conv is None:
                continue
            if conv.agent == prompt.agent and key not in busy:
                common = _common(conv.tokens, ids)
                if common in (len(conv.tokens), len(ids)):
                    return key
            break
        self._made += 1
        return f"p{self._made}"

    def keys(self) -> list[str]:
        return list(self._convs)

    def tokens(self, key: str) -> list[int] | None:
        conv = self._convs.get(key)
        return None if conv is None else conv.tokens

    def record(self, key: str, agent: str, tokens: list[int]) -> None:
        """``key``'s cached sequence is now ``tokens`` (its prompt followed by its output)."""
        old = self._convs.get(key)
        self.tokens_held += len(tokens) - (len(old.tokens) if old else 0)
        self._convs[key] = Conversation(agent, tokens)
        for h in self._keys(tokens):
            self._owner[h] = key

    @staticmethod
    def _keys(tokens: list[int]) -> list[int]:
        """Its page hashes, and the keys of its first few prefixes shorter than a page (so a
        short request finds the conversation it begins, and a request finds a short one)."""
        return _chain(tokens) + [_short(tokens[:n]) for n in range(1, min(len(tokens), PAGE - 1) + 1)]

    def forget(self, key: str) -> None:
        conv = self._convs.pop(key, None)
        if conv is None:
            return
        self.tokens_held -= len(conv.tokens)
        for h in self._keys(conv.tokens):
            if self._owner.get(h) == key:
                del self._owner[h]


@dataclass(eq=False)
class Ticket:
    """One request inside the engine, as the HTTP handlers wait on it."""

    request: Request
    stream: bool = False
    time_scale: float = 1.0
    started: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    notified: int = -1  # ``generated`` when ``changed`` was last set

    @property
    def generated(self) -> int:
        """Output tokens produced so far (the first comes with the end of prefill)."""
        r = self.request
        if r.first_token_at is None:
            return 0
        return r.output - r.decode_left


@dataclass
class Counters:
    """Cumulative figures for ``/metrics`` (SGLang counts a request when it finishes)."""

    requests: int = 0
    aborted: int = 0  # requests whose client went away before the end
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_device: int = 0
    cached_host: int = 0


class RealtimeEngine:
    """Runs ``worker`` in real time × ``time_scale``. All methods run on the event loop thread."""

    def __init__(
        self,
        worker: WorkerModel,
        time_scale: float,
        *,
        prune_floor_tokens: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        #: called after every change of the engine's state (KV-event publishing hooks in here)
        self.on_change: Callable[[], None] | None = None
        #: the ``session_id`` a program's latest request carried (SGLang reports it in KV events)
        self.sessions: dict[str, str] = {}
        self.time_scale = time_scale
        self.index = ConversationIndex()
        self.counters = Counters()
        #: the index is pruned of conversations without KV once it holds this many tokens (it
        #: grows by every conversation ever seen; what the engine holds is bounded by its capacity)
        self._prune_at = max(4 * (worker.gpu_tokens + worker.host_tokens), prune_floor_tokens)
        self._clock = clock
        self._t0 = clock()
        self._tickets: dict[int, Ticket] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failure: str | None = None

    def now(self) -> float:
        return (self._clock() - self._t0) * self.time_scale

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-worker engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def busy(self) -> set[str]:
        return {r.program_id for r in self.worker.running} | {r.program_id for r in self.worker.queue}

    def submit(
        self,
        prompt: Prompt,
        output_ids: list[int],
        *,
        priority: int | None = None,
        stream: bool = False,
        session_id: str | None = None,
    ) -> Ticket:
        """Queue a request whose output will be ``output_ids`` (the double decides its reply up front)."""
        if self.failure is not None:
            raise EngineFailed(self.failure)
        pid = self.index.resolve(prompt, self.busy())
        if session_id is not None:
            self.sessions[pid] = session_id
        self.index.record(pid, prompt.agent, prompt.ids + output_ids)
        now = self.now()
        # the engine keeps SGLang's ratchet: cached KV keeps the highest priority it was given
        request = Request(pid, prompt.agent or "-", len(prompt.ids), len(output_ids), now, prompt.prefix, priority=priority)
        ticket = Ticket(request, stream, self.time_scale)
        self._tickets[id(request)] = ticket
        try:
            self._dispatch(self.worker.submit(request, now))
        except Exception as exc:
            self._fail(exc)
            raise EngineFailed(self.failure) from exc
        self._wake.set()
        return ticket

    def _fail(self, exc: Exception) -> None:
        """A bug in the engine model must not hang clients: fail every request, loudly."""
        log.exception("sim-worker: the engine model failed; every request now fails")
        self.failure = f"engine model failed: {type(exc).__name__}: {exc}"
        for ticket in self._tickets.values():
            ticket.done.set()
            ticket.changed.set()
        self._tickets.clear()

    def abort(self, ticket: Ticket) -> None:
        """The client went away before the end: drop the request as SGLang does."""
        if self._tickets.pop(id(ticket.request), None) is not None and self.worker.abort(ticket.request):
            self.counters.aborted += 1
            ticket.done.set()
            self._wake.set()
            if self.on_change is not None:
                self.on_change()

    def _dispatch(self, finished: list[Request]) -> None:
        for ticket in self._tickets.values():
            r = ticket.request
            if not ticket.started.is_set() and (r.prefill_left > 0 or r.first_token_at is not None):
                ticket.started.set()
                self.counters.prompt_tokens += r.context
                self.counters.cached_device += r.hit_tokens - r.host_hit_tokens
                self.counters.cached_host += r.host_hit_tokens
            if ticket.stream and ticket.generated != ticket.notified:
                ticket.notified = ticket.generated
                ticket.changed.set()
        for r in finished:
            ticket = self._tickets.pop(id(r))
            ticket.changed.set()
            self.counters.requests += 1
            self.counters.generation_tokens += r.output
            ticket.done.set()
        if finished and self.index.tokens_held > self._prune_at:
            self._prune()
        if self.on_change is not None:
            self.on_change()

    def _prune(self) -> None:
        """Forget conversations the engine no longer holds any KV for."""
        busy = self.busy()

        def holds_nothing(pid: str) -> bool:
            seg = self.worker.segments.get(pid)
            return pid not in busy and (seg is None or not (seg.gpu or seg.host))

        for pid in [p for p in self.index.keys() if holds_nothing(p)]:
            self.worker.forget(pid)
            self.index.forget(pid)
            self.sessions.pop(pid, None)
        # what is left has KV (bounded by the capacity): look again only after as much growth
        self._prune_at = max(self._prune_at, 2 * self.index.tokens_held)

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:
            self._fail(exc)

    async def _loop(self) -> None:
        while True:
            self._dispatch(self.worker.advance(self.now()))
            nxt = self.worker.next_event_time()
            wait = None if nxt is None else max((nxt - self.now()) / self.time_scale, MIN_WAKE_S)
            if any(t.stream and t.started.is_set() for t in self._tickets.values()):
                wait = STREAM_INTERVAL_S if wait is None else min(wait, STREAM_INTERVAL_S)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
