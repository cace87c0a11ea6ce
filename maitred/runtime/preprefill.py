"""Pre-prefill planning (LOCAL + TAO): compute a prompt's KV before the request arrives.

Proposals come from (a) handoffs whose consumer has not asked yet — its predicted prompt is the
consumer agent's prefix plus the shared messages — and (b) programs about to return (r = 1)
whose KV is not on their worker's GPU: a load back from host memory, or a recompute. A worker
admits warmups while fewer than a cap are in flight there, the best Π first. A warmup that needs
new KV room waits for an empty foreground queue and free KV beyond a reserve. A handoff's consumer
in the GPU tier of that worker needs none up to the room the plan holds for it: its prompt
replaces the producer's context. So under load (always a queue, no free KV) it is still warmed,
and the engine runs foreground prefill first (measured at synthetic C=80 ×1 with handoffs=0.5:
otherwise 5 of 250 handoff proposals were admitted).
"""

from collections.abc import Mapping

from maitred.runtime.decisions import Assignment, Warmup
from maitred.runtime.records import Phase, Tier
from maitred.runtime.signals import cache_credit, preprefill_priority
from maitred.runtime.state import View


def propose(view: View, assignments: tuple[Assignment, ...]) -> list[Warmup]:
    cfg = view.cfg
    assigned = {a.program_id: a.worker for a in assignments}
    versions = dict(view.adapter_versions)
    proposals: list[Warmup] = []
    for h in view.handoffs:
        consumer = view.programs.get(h.program_id)
        producer_home = consumer.home_worker if consumer else None
        worker = assigned.get(h.program_id, producer_home)
        if worker is None:
            continue
        prefix = h.expected_prompt_tokens if h.expected_prompt_tokens is not None else view.agent_prefix_tokens.get(h.to_agent, 0)
        tokens = prefix + h.context_tokens
        # Cache under another agent's prompt prefix is not a prefix of the consumer's prompt.
        same_prefix = consumer is not None and consumer.agent == h.to_agent
        have = (
            cache_credit(consumer, worker, view.now, cfg.credit_half_life_s, versions)
            if consumer is not None and same_prefix
            else 0
        )
        missing = tokens - have
        confidence = 1.0 if h.expected_prompt_tokens is not None else 0.5
        priority = preprefill_priority(missing, consumers=h.consumers, confidence=confidence, heat=1.0, cfg=cfg)
        if priority > 0:
            proposals.append(Warmup(h.program_id, worker, tokens, "handoff", priority, h.to_agent))
    reasoning, gpu = Phase.REASONING, Tier.GPU  # an enum member read per program is slow on 3.11
    for pid, p in view.programs.items():
        if p.phase is reasoning or p.tier is gpu or view.signals[pid].readiness.r != 1:
            continue
        worker = assigned.get(pid, p.home_worker)
        if worker is None:
            continue
        kind = "load_back" if p.tier is Tier.CPU and worker == p.home_worker else "recompute"
        confidence = 1.0 if p.returned else 0.7
        priority = preprefill_priority(p.context_tokens, consumers=1, confidence=confidence, heat=1.0, cfg=cfg)
        if priority > 0:
            proposals.append(Warmup(pid, worker, p.context_tokens, kind, priority, p.agent))
    return proposals


def choose_warmups(
    view: View, proposals: list[Warmup], gpu_free: dict[str, int], tiers: Mapping[str, Tier] | None = None
) -> tuple[Warmup, ...]:
    """``tiers``: every program's tier once the step's own moves and placements are made (a
    program the step demotes holds no room for its consumer); default: the view's."""
    cfg = view.cfg
    free = dict(gpu_free)
    in_flight = {w.worker_id: w.warmups_in_flight for w in view.workers.values()}
    for w in view.workers.values():
        if w.used_tokens is not None and w.worker_id in free:
            free[w.worker_id] = min(free[w.worker_id], w.gpu_tokens - w.used_tokens)
    admitted, seen = [], set()
    for warmup in sorted(proposals, key=lambda x: -x.priority):
        worker = view.workers.get(warmup.worker)
        if worker is None or not worker.healthy or warmup.program_id in seen:
            continue
        if not view.prompts.sendable(warmup.program_id, warmup.kind):  # the driver has nothing right to send
            continue
        if in_flight[warmup.worker] >= cfg.max_warmups_in_flight:
            continue
        # A warmup that needs no new room takes nothing a queued request waits for (the engine
        # runs foreground prefill first); one that does waits for an empty queue and free KV.
        need = room_needed(view, warmup, tiers)
        if need > 0 and (worker.queued_requests > 0 or free.get(warmup.worker, 0) - need < cfg.warmup_reserve_tokens):
            continue
        admitted.append(warmup)
        seen.add(warmup.program_id)
        in_flight[warmup.worker] += 1
        free[warmup.worker] -= need
    return tuple(admitted)


def room_needed(view: View, warmup: Warmup, tiers: Mapping[str, Tier] | None = None) -> int:
    """GPU tokens a warmup takes beyond what the plan already gives its program there. A
    handoff's consumer in the GPU tier of that worker holds room for the producer's context,
    which the consumer's prompt replaces (it sits under another agent's prefix, so the engine
    drops it): only the part of the new prompt beyond that room is new."""
    p = view.programs.get(warmup.program_id)
    if warmup.kind != "handoff" or p is None or p.home_worker != warmup.worker:
        return warmup.tokens
    if (tiers.get(p.program_id, p.tier) if tiers is not None else p.tier) is not Tier.GPU:
        return warmup.tokens
    return max(warmup.tokens - p.weight(view.cfg.reserve_tokens), 0)
