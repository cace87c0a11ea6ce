"""The host tier of the engine model's worker, as SGLang's HiCache keeps it.

Host memory follows SGLang's HiCache (sgl-project/sglang ``python/sglang/srt/mem_cache/
hiradix_cache.py``, ``memory_pool_host.py``) when offloading is on: its default ``write_through``
policy copies every newly cached block to host memory as it is cached (here: when the request
that computed it ends), so GPU eviction writes nothing and a block evicted from the GPU without
a host copy (the host was full) is gone. Host eviction only removes host copies of blocks that
are already off the GPU; MORI's engine patch (``host_evicts_gpu_copies``) lets it drop the host
copies of GPU-resident programs first instead, in the scheduler's tier ranks. With
``--hicache-write-policy write_back`` (``write_back``) nothing is copied when cached: a block is
written to host memory when it is evicted from the GPU, and the eviction waits for the copy
(``HiRadixCache.evict`` calls ``writing_check(write_back=True)``, which blocks the scheduler), so
the host pool holds what left the GPU instead of mirroring it.

``HostCache`` is a base of ``maitred.sim.engine.WorkerModel``, which owns the state it names: the
host tier's bookkeeping (copies, write-back stalls, host eviction, loads over the host-to-GPU
link) reads apart from the GPU side (admission, batching, GPU eviction) that calls it.
"""

from collections import deque

from maitred.sim.engine_records import EngineStats, Request, Segment
from maitred.sim.profile import EngineProfile


class HostCache:
    """Host-tier methods of ``WorkerModel``; the annotations are the worker's fields they use."""

    profile: EngineProfile
    host_tokens: int
    offload: bool
    typed_eviction: bool
    host_evicts_gpu_copies: bool
    host_ranks: dict[str, int]
    segments: dict[str, Segment]
    running: list[Request]
    queue: deque[Request]
    t: float
    link_free_at: float
    stalled_until: float
    host_used: int
    stats: EngineStats

    def _busy_programs(self) -> set[str]:
        return {r.program_id for r in self.running} | {r.program_id for r in self.queue}

    def _to_host(self, pid: str, seg: Segment, tokens: int) -> None:
        """Write-through (a host copy is then a prefix, ``host_from`` 0): copy the first
        ``tokens`` of ``pid``'s context to host memory (what is already there is not resent),
        evicting other host copies to make room; what still does not fit is not copied."""
        extra = max(tokens - seg.host, 0)
        if extra == 0:
            return
        short = extra - (self.host_tokens - self.host_used)
        if short > 0:
            self._evict_host(short, {pid})
            extra = min(extra, self.host_tokens - self.host_used)
        if extra <= 0:
            return
        seg.host += extra
        self.host_used += extra
        self.stats.transfer_bytes += extra * self.profile.kv_bytes_per_token

    def _write_back(self, pid: str, seg: Segment, start: int, keep: set[str]) -> None:
        """Write-back eviction of ``pid``'s GPU tokens from ``start`` on: copy what has no host
        copy yet, so the host copy becomes one range with them; the scheduler waits for the
        copy. In the rare case of a gap between an older copy and the evicted tokens, the gap
        (still on the GPU) is copied too; an older copy that no longer joins the GPU part (the
        GPU tokens before it were lost) is given up. Room is made by dropping other host copies,
        never those of ``keep`` (the programs being served, whose copies are about to load).
        Without room for the copy the blocks are lost, as when SGLang cannot allocate host
        memory for them."""
        if seg.host_from > seg.gpu:
            self.host_used -= seg.host - seg.host_from
            seg.host = seg.host_from = 0
        lo, hi = (min(seg.host_from, start), max(seg.host, seg.gpu)) if seg.host > seg.host_from else (start, seg.gpu)
        copied = (hi - lo) - (seg.host - seg.host_from)
        if copied <= 0:
            return
        short = copied - (self.host_tokens - self.host_used)
        if short > 0:
            self._evict_host(short, keep | {pid})
            if copied > self.host_tokens - self.host_used:
                return
        seg.host_from, seg.host = lo, hi
        self.host_used += copied
        self.stats.transfer_bytes += copied * self.profile.kv_bytes_per_token
        self.stalled_until = max(self.stalled_until, self.t) + self.profile.load_s(copied)

    def _evict_host(self, short: int, keep: set[str]) -> None:
        """Free ``short`` host tokens, tail first, in LRU order (tier ranks first when the policy
        types eviction). Stock HiCache only takes host copies of blocks already evicted from
        the GPU (the part of a copy beyond ``gpu``); MORI's patch may take any copy."""
        busy = self._busy_programs()

        def rank(kv: tuple[str, Segment]) -> tuple[int, float]:
            return (self.host_ranks.get(kv[0], 0) if self.typed_eviction else 0, kv[1].last)

        for other_pid, other in sorted(self.segments.items(), key=rank):
            if short <= 0:
                break
            if other_pid in keep or other_pid in busy:
                continue
            floor = max(0 if self.host_evicts_gpu_copies else other.gpu, other.host_from)
            take = min(max(other.host - floor, 0), short)
            other.host -= take
            self.host_used -= take
            short -= take
            if other.host <= other.host_from:
                other.host = other.host_from = 0

    def _host_after(self, seg: Segment, gpu: int, upto: int) -> int:
        """Tokens of ``seg`` in host memory that continue its GPU part ``[0, gpu)``, up to ``upto``."""
        if not self.offload or seg.host_from > gpu:
            return 0
        return min(max(seg.host - gpu, 0), max(upto - gpu, 0))

    def _load(self, seg: Segment, tokens: int, now: float) -> float:
        start = max(now, self.link_free_at)
        self.link_free_at = start + self.profile.load_s(tokens)
        self.stats.transfer_bytes += tokens * self.profile.kv_bytes_per_token
        return self.link_free_at
