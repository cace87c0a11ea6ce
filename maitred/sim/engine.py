"""A discrete-event model of one SGLang-like worker: KV memory, prefix cache, batching, transfers.

Memory, in tokens: each program's cached private context (``gpu``, and a ``host`` copy when the
policy offloads), each agent's shared system prompt, and the reservations of running requests.
Like SGLang, the engine offers no call that evicts one program's KV: a scheduler steers eviction
only through request priorities (GPU side) and tier ranks (host side, MORI's inverted order),
and can bring KV back ahead of a request (a prefill-only warmup loads it from host memory).
A request hits what is resident on the GPU, loads what is in host memory (over the host-to-GPU
link, FIFO), and recomputes the rest; it starts only when its whole context plus output fits,
evicting idle KV from the tail (least recently used first, or lowest scheduler priority first
when the policy asks for typed eviction).

Host memory follows SGLang's HiCache when offloading is on (write-through by default,
write-back as an option); its bookkeeping is in ``maitred.sim.host_cache``.

Eviction priority comes two ways. Stock SGLang (``--radix-eviction-policy priority``) takes it
from requests, and a cached prefix keeps the highest priority any request gave it (the
ratchet: ``set_priority``); it starts afresh only for KV recomputed after a full eviction.
MORI's engine patch labels the cached nodes from the scheduler instead (``relabel``), which can
lower them.

Time: continuous batching. Every step runs one prefill chunk (head of the queue, foreground
before warmups) and one decode token for every decoding request; its duration comes from the
engine profile. While the batch does not change every step costs the same, so the model jumps
from one batch change to the next instead of stepping token by token.
"""

import math
from collections import deque
from dataclasses import dataclass, field

from maitred.sim.engine_records import EngineStats, Prefix, Request, Segment
from maitred.sim.host_cache import HostCache
from maitred.sim.profile import EngineProfile

#: What callers import from here; ``Request`` is defined with the other records in ``engine_records``.
__all__ = ["Request", "WorkerModel"]


@dataclass
class WorkerModel(HostCache):
    worker_id: str
    profile: EngineProfile
    gpu_tokens: int
    host_tokens: int
    offload: bool = False
    typed_eviction: bool = False
    host_evicts_gpu_copies: bool = False  # MORI's patch: host copies of GPU-resident KV may go first
    write_back: bool = False  # HiCache ``--hicache-write-policy write_back`` (else write_through)
    priorities: dict[str, int] = field(default_factory=dict)  # GPU eviction: lowest first
    host_ranks: dict[str, int] = field(default_factory=dict)  # host eviction: lowest first
    segments: dict[str, Segment] = field(default_factory=dict)
    prefixes: dict[str, Prefix] = field(default_factory=dict)
    running: list[Request] = field(default_factory=list)
    queue: deque[Request] = field(default_factory=deque)
    t: float = 0.0
    link_free_at: float = 0.0
    stalled_until: float = 0.0  # a write-back eviction blocks the scheduler until its copy is done
    gpu_used: int = 0
    host_used: int = 0
    stats: EngineStats = field(default_factory=EngineStats)

    # -- memory ---------------------------------------------------------------------------------

    def free(self) -> int:
        return self.gpu_tokens - self.gpu_used

    def locked_tokens(self) -> int:
        """GPU tokens held by running work: the KV of programs with a request
        running or queued and the prefixes in use. What SGLang reports as token usage (cached
        KV that could be evicted is not counted)."""
        busy = self._busy_programs()
        return sum(seg.gpu for pid, seg in self.segments.items() if pid in busy) + sum(
            p.tokens for p in self.prefixes.values() if p.resident and p.users > 0
        )

    def _evict(self, need: int, keep: set[str], keep_agent: str | None) -> None:
        """Free ``need`` tokens of idle KV, tail first. With write-through nothing is written
        here (the blocks were copied to host memory when they were cached); with write-back the
        evicted blocks without a host copy are copied first and the worker stalls until the
        copy is done."""
        if need <= 0:
            return
        busy = self._busy_programs() | keep
        victims: list[tuple[tuple[float, float], str, bool]] = []
        for pid, seg in self.segments.items():
            if seg.gpu > 0 and pid not in busy:
                rank = (self.priorities.get(pid, 0), seg.last) if self.typed_eviction else (0, seg.last)
                victims.append((rank, pid, False))
        for agent, prefix in self.prefixes.items():
            if prefix.resident and prefix.users == 0 and agent != keep_agent:
                victims.append(((math.inf if self.typed_eviction else 0, prefix.last), agent, True))
        victims.sort()
        for _, key, is_prefix in victims:
            if need <= 0:
                break
            if is_prefix:
                prefix = self.prefixes[key]
                prefix.resident = False
                self.gpu_used -= prefix.tokens
                need -= prefix.tokens
                continue
            seg = self.segments[key]
            take = min(seg.gpu, need)
            if self.offload and self.write_back:
                self._write_back(key, seg, seg.gpu - take, busy)
            seg.gpu -= take
            self.gpu_used -= take
            need -= take

    def _segment(self, pid: str, agent: str) -> Segment:
        seg = self.segments.get(pid)
        if seg is None or seg.agent != agent:
            if seg is not None:  # a new agent's prompt: the old KV is under another prefix
                self.gpu_used -= seg.gpu
                self.host_used -= seg.host - seg.host_from
            seg = self.segments[pid] = Segment(agent)
        return seg

    # -- requests -------------------------------------------------------------------------------

    def submit(self, req: Request, now: float) -> list[Request]:
        """Queue a request; returns requests that finished while catching up to ``now``."""
        finished = self.advance(now)
        req.ready_at = now
        self.queue.append(req)
        self._start_queued()
        return finished

    def _start_queued(self) -> None:
        while self.queue and len(self.running) < self.profile.max_running:
            if not self._try_start(self.queue[0]):
                break
            self.queue.popleft()

    def _try_start(self, req: Request) -> bool:
        now = self.t
        seg = self._segment(req.program_id, req.agent)
        prefix = self.prefixes.get(req.agent)
        if prefix is None:
            prefix = self.prefixes[req.agent] = Prefix(req.prefix)
        shared = prefix.resident
        private = max(req.context - prefix.tokens, 0)
        gpu_hit = min(seg.gpu, private)
        host_hit = self._host_after(seg, gpu_hit, private)
        need = (0 if shared else prefix.tokens) + private + req.output - seg.gpu
        if need > self.free():
            self._evict(need - self.free(), {req.program_id}, req.agent)
            if need > self.free():
                return False
        if req.priority is not None:
            self.set_priority(req.program_id, req.priority)
        prefix.resident = True
        prefix.users += 1
        prefix.last = now
        self.gpu_used += need
        seg.gpu = private + req.output
        seg.last = now
        req.ready_at = max(req.ready_at, now, seg.loading_until)
        if host_hit:
            req.ready_at = max(req.ready_at, self._load(seg, host_hit, req.ready_at))
        recompute = private - gpu_hit - host_hit + (0 if shared else prefix.tokens)
        req.prefill_left = max(recompute, 1)
        req.decode_left = req.output
        req.hit_tokens = gpu_hit + host_hit + (prefix.tokens if shared else 0)
        req.host_hit_tokens = host_hit
        req.recomputed = recompute
        if req.background is None:
            self.stats.prompt_tokens += req.context
            self.stats.hit_tokens += req.hit_tokens
        self.stats.recomputed_tokens += recompute
        self.running.append(req)
        return True

    # -- policy actions -------------------------------------------------------------------------

    def set_priority(self, pid: str, priority: int) -> None:
        """A request of ``pid`` carries ``priority`` (stock SGLang priority eviction): its cached
        KV keeps the highest priority any request gave it (sgl-project/sglang
        ``python/sglang/srt/mem_cache/radix_cache.py``, priority propagated as a max along the
        path); KV recomputed after a full eviction starts from this request's priority."""
        seg = self.segments.get(pid)
        held = seg is not None and seg.gpu > 0
        self.priorities[pid] = max(priority, self.priorities.get(pid, priority)) if held else priority

    def relabel(self, priorities: dict[str, int], host_ranks: dict[str, int]) -> None:
        """MORI's engine patch: the scheduler labels the cached nodes directly (GPU eviction in
        ``priorities``, host eviction in ``host_ranks``, lowest first); labels may go down."""
        self.priorities = dict(priorities)
        self.host_ranks = dict(host_ranks)

    def remove(self, pid: str) -> None:
        """The program ended: cancel its warmups, free its KV on both tiers and forget it (its
        foreground requests have all finished)."""
        for r in [r for r in self.queue if r.program_id == pid and r.background is not None]:
            self.queue.remove(r)
        for r in [r for r in self.running if r.program_id == pid and r.background is not None]:
            self._drop_running(r)
        self.drop(pid)
        self.forget(pid)
        self._start_queued()

    def drop(self, pid: str) -> None:
        seg = self.segments.get(pid)
        if seg is None or pid in self._busy_programs():
            return
        self.gpu_used -= seg.gpu
        self.host_used -= seg.host - seg.host_from
        seg.gpu = seg.host = seg.host_from = 0

    def forget(self, pid: str) -> bool:
        """Remove a program that holds no KV here and has nothing queued or running, so a
        long-running worker does not keep every program it ever saw."""
        seg = self.segments.get(pid)
        if seg is None or seg.gpu or seg.host or pid in self._busy_programs():
            return False
        del self.segments[pid]
        self.priorities.pop(pid, None)
        self.host_ranks.pop(pid, None)
        return True

    def promote(self, pid: str, now: float) -> bool:
        """Host → GPU ahead of the request; False when there is nothing to load or no room.
        The caller has advanced the worker to ``now``."""
        seg = self.segments.get(pid)
        tokens = self._host_after(seg, seg.gpu, seg.host) if seg is not None else 0
        if seg is None or tokens == 0:
            return False
        if tokens > self.free():
            self._evict(tokens - self.free(), {pid}, seg.agent)
            if tokens > self.free():
                return False
        self.gpu_used += tokens
        seg.gpu += tokens
        seg.loading_until = self._load(seg, tokens, now)
        seg.last = now
        return True

    def warm(self, pid: str, agent: str, tokens: int, prefix_tokens: int, now: float, priority: int | None = None) -> bool:
        """Prefill ``tokens`` of ``pid``'s next prompt as background work (LOCAL's pre-prefill),
        with the request priority the gateway sends with a warmup (None: none). The caller has
        advanced the worker to ``now``."""
        seg = self.segments.get(pid)
        if seg is not None and seg.agent == agent and seg.gpu + prefix_tokens >= tokens:
            return False
        if any(r.program_id == pid for r in self.running) or any(r.program_id == pid for r in self.queue):
            return False
        req = Request(pid, agent, tokens, 0, now, prefix_tokens, background="warmup", priority=priority)
        if not self._try_start(req):
            return False
        self.stats.warmups += 1
        return True

    # -- time -----------------------------------------------------------------------------------

    def _step_plan(self) -> tuple[float, int, Request | None, list[Request]] | None:
        """(step time, steps until the batch changes, prefilling head, decoders), or None if idle."""
        decoders = [r for r in self.running if r.prefill_left == 0]
        prefilling = [r for r in self.running if r.prefill_left > 0 and r.ready_at <= self.t]
        head = None
        if prefilling:
            foreground = [r for r in prefilling if r.background is None]
            head = (foreground or prefilling)[0]
        if head is None and not decoders:
            return None
        chunk = min(self.profile.prefill_chunk_tokens, head.prefill_left) if head else 0
        context = sum(r.context + r.output - r.decode_left for r in decoders)
        tau = self.profile.step_s(chunk, len(decoders), context)
        steps = math.ceil(head.prefill_left / self.profile.prefill_chunk_tokens) if head else math.inf
        if decoders:
            steps = min(steps, min(r.decode_left for r in decoders))
        return tau, int(steps), head, decoders

    def _pending_loads(self) -> list[float]:
        return [r.ready_at for r in self.running if r.prefill_left > 0 and r.ready_at > self.t]

    def _steps_until_change(self, tau: float, steps: int, loads: list[float]) -> int:
        """A load finishing changes the batch at the first step boundary after it."""
        if loads:
            steps = min(steps, max(1, math.ceil((min(loads) - self.t) / tau)))
        return steps

    def next_event_time(self) -> float | None:
        if self.stalled_until > self.t:
            return self.stalled_until
        plan = self._step_plan()
        loads = self._pending_loads()
        if plan is None:
            return min(loads) if loads else None
        tau, steps, _, _ = plan
        return self.t + tau * self._steps_until_change(tau, steps, loads)

    def advance(self, now: float) -> list[Request]:
        """Run the batch up to ``now`` (whole steps only); returns requests that finished."""
        finished: list[Request] = []
        while self.t < now:
            if self.stalled_until > self.t:  # a write-back eviction holds the scheduler
                self.t = min(self.stalled_until, now)
                continue
            plan = self._step_plan()
            loads = self._pending_loads()
            if plan is None:
                self.t = min([now] + loads)
                if not loads or self.t >= now:
                    self.t = now
                    break
                continue
            tau, steps, head, decoders = plan
            steps = self._steps_until_change(tau, steps, loads)
            fit = int((now - self.t) / tau + 1e-9)  # the event time is t + n·tau, up to rounding
            n = min(steps, fit)
            if n <= 0:
                break
            self.t += n * tau
            for r in decoders:
                r.decode_left -= n
                if r.decode_left == 0:
                    finished.append(self._finish(r))
            if head is not None:
                head.prefill_left = max(head.prefill_left - n * self.profile.prefill_chunk_tokens, 0)
                if head.prefill_left == 0:
                    head.first_token_at = self.t
                    if head.background is not None or head.output <= 1:
                        head.decode_left = 0
                        finished.append(self._finish(head))
                    else:
                        head.decode_left = head.output - 1
        if finished:
            self._start_queued()
        return finished

    def _finish(self, req: Request) -> Request:
        req.done_at = self.t
        self.running.remove(req)
        prefix = self.prefixes[req.agent]
        prefix.users -= 1
        prefix.last = self.t
        seg = self.segments[req.program_id]
        seg.last = self.t
        if self.offload and not self.write_back:
            self._to_host(req.program_id, seg, seg.gpu)
        if req.background is None:
            self.stats.output_tokens += req.output
        return req

    def cancel_warmup(self, pid: str) -> None:
        """The real request overtook its warmup: keep what was computed, drop the rest."""
        for r in list(self.running):
            if r.program_id == pid and r.background is not None and r.prefill_left > 0:
                self._drop_running(r)

    def abort(self, req: Request) -> bool:
        """The client gave up on ``req`` (SGLang aborts a request whose client disconnects): out of
        the queue, or out of the batch keeping the KV computed so far. False if it had finished."""
        queued = next((i for i, r in enumerate(self.queue) if r is req), None)
        if queued is not None:
            del self.queue[queued]
        elif any(r is req for r in self.running):
            self._drop_running(req)
            self._start_queued()
        else:
            return False
        req.done_at = self.t
        return True

    def _drop_running(self, r: Request) -> None:
        del self.running[next(i for i, x in enumerate(self.running) if x is r)]
        self.prefixes[r.agent].users -= 1
        seg = self.segments[r.program_id]
        undone = min(r.prefill_left + r.decode_left, seg.gpu)
        seg.gpu -= undone
        self.gpu_used -= undone

    def queued_foreground(self) -> int:
        return sum(1 for r in self.queue if r.background is None) + sum(
            1 for r in self.running if r.background is None and r.prefill_left > 0
        )
