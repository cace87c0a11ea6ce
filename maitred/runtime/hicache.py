"""How maitred wants SGLang's hierarchical cache (HiCache) written: one rule, used where maitred
launches workers (``maitred sglang-args``) and where the replay models them.

HiCache's default ``write_through`` copies every block to host memory as it is cached, so the
host pool mirrors the GPU and only host memory beyond the GPU's keeps what left it: with a host
pool the size of the GPU, an idle program pushed off the GPU is recomputed. ``write_back``
copies a block when it is evicted instead (sgl-project/sglang ``python/sglang/srt/mem_cache/
hiradix_cache.py``, ``evict``), so GPU and host add up, but every eviction waits for its copy
(``writing_check(write_back=True)`` blocks the scheduler). The room write-back adds is
``(1 + R) / max(1, R)`` for a host pool of R GPUs: 2× at R = 1, 1.5× at R = 2.

Measured on the replay (one hour, C = 80, H100 profile; BENCHMARKS.md, ``write-policy``
matrices): at R = 1 write-back gives maitred 639 against 576 tok/s on tools ×4 and 1,069
against 1,055 on SWE-agent; at R = 2 it gained nothing when the rule was chosen and cost up to
2% on SWE-agent (1,102 against 1,125), whose evictions are frequent and whose idle programs
are few. So write-back below ``WRITE_BACK_BELOW_RATIO``, write-through from there on.
"""

WRITE_BACK_BELOW_RATIO = 2.0


def write_back_for(hicache_ratio: float) -> bool:
    """Whether maitred runs a worker whose host pool is ``hicache_ratio`` GPUs with write-back."""
    return hicache_ratio < WRITE_BACK_BELOW_RATIO
