"""MORI's sticky three-tier placement, per worker, ranked by relative idleness.

Source: MORI (arXiv 2026, seed text "How MORI Works"): three queues with admission control per
tier, sticky placement, lazy demotion of reasoning programs, and a boundary that moves with
the busy set ("when busy programs outgrow HBM the boundary moves up and squeezes out a few more
of the most idle").

Nothing moves down while both capacities hold. When the GPU tier is
over capacity, the most idle *acting* program goes down to host memory (or is dropped when the
host tier cannot take it); if every GPU program is mid-step, the most idle is marked for lazy
demotion when its step ends. When the host tier is over capacity, its most idle program is
dropped to ``waiting``. When the GPU has room, programs come back up: first those that want it
now (request waiting, or tool just returned), least idle first; then those predicted to return
(r = 1) — promotion ahead of the return. With ``displace`` (MORI), a program that wants the GPU
now and does not fit squeezes out the most idle acting GPU programs that are more idle than it
(only if that makes it fit); without, nothing is displaced for it. A demoted program's host
copy stays on its home worker and promotion brings it back there (affinity).
"""

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from maitred.runtime.decisions import TierMove
from maitred.runtime.records import Phase, ProgramState, Tier, WorkerState
from maitred.runtime.state import View


@dataclass
class TierPlan:
    """The moves decided so far, and the tier every homed program will be in after them.

    Tokens per worker and tier (all programs, and those marked for lazy demotion) are kept up
    to date as moves are made: planning asks after every move, and summing a worker's programs
    for each question made a step quadratic in the programs per worker."""

    view: View
    moves: list[TierMove] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)
    lazy: set[str] = field(default_factory=set)
    by_worker: dict[str, list[ProgramState]] = field(default_factory=lambda: defaultdict(list))
    _tokens: dict[str, dict[Tier, int]] = field(default_factory=dict, repr=False)
    _lazy_tokens: dict[str, dict[Tier, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        workers, reserve = self.view.workers, self.view.cfg.reserve_tokens
        self._tokens = {w: dict.fromkeys(Tier, 0) for w in workers}
        self._lazy_tokens = {w: dict.fromkeys(Tier, 0) for w in workers}
        for p in self.view.programs.values():
            home = p.home_worker
            if home is not None and home in workers:
                self.by_worker[home].append(p)
                self.tiers[p.program_id] = p.tier
                self._tokens[home][p.tier] += p.weight(reserve)
                if p.lazy_demote and p.tier is Tier.GPU:  # marked in an earlier step, still mid-step
                    self.mark_lazy(p)

    def weight(self, p: ProgramState) -> int:
        return p.weight(self.view.cfg.reserve_tokens)

    def iota(self, p: ProgramState) -> float:
        return self.view.signals[p.program_id].idleness

    def used(self, worker_id: str, tier: Tier, *, lazy: bool = True) -> int:
        """Tokens in ``tier`` on the worker; ``lazy=False`` leaves out programs marked for lazy
        demotion (they leave when their step ends, so they do not count against the cap), but
        their KV is still there: room for newcomers counts them."""
        if worker_id not in self._tokens:
            return 0
        return self._tokens[worker_id][tier] - (0 if lazy else self._lazy_tokens[worker_id][tier])

    def gpu_free(self) -> dict[str, int]:
        """GPU tokens free for newcomers on each healthy worker once these moves are done."""
        return {w.worker_id: w.gpu_tokens - self.used(w.worker_id, Tier.GPU) for w in self.view.healthy_workers()}

    def move(self, p: ProgramState, worker_id: str, dst: Tier) -> None:
        src, home = self.tiers[p.program_id], _home(p)
        self.moves.append(TierMove(p.program_id, worker_id, src, dst))
        self.tiers[p.program_id] = dst
        for tokens in (self._tokens, self._lazy_tokens) if p.program_id in self.lazy else (self._tokens,):
            tokens[home][src] -= self.weight(p)
            tokens[home][dst] += self.weight(p)

    def mark_lazy(self, p: ProgramState) -> None:
        """Count ``p`` as leaving the GPU when its step ends (MORI's lazy demotion)."""
        self.lazy.add(p.program_id)
        self._lazy_tokens[_home(p)][self.tiers[p.program_id]] += self.weight(p)

    def demote(self, p: ProgramState, worker: WorkerState) -> None:
        self.move(p, worker.worker_id, Tier.CPU if self.weight(p) <= worker.cpu_tokens else Tier.WAITING)

    def make_room(self, worker_id: str, tokens: int, iota: float) -> bool:
        """MORI's moving boundary: demote the most idle acting GPU programs on the worker that
        are more idle than ``iota`` until ``tokens`` fit; nothing moves unless that suffices."""
        worker = self.view.workers[worker_id]
        free = worker.gpu_tokens - self.used(worker_id, Tier.GPU)
        if tokens <= free:
            return True
        victims = sorted(
            (
                p
                for p in self.by_worker[worker_id]
                if self.tiers[p.program_id] is Tier.GPU
                and p.phase is not Phase.REASONING
                and p.program_id not in self.lazy
                and self.iota(p) > iota
            ),
            key=lambda p: -self.iota(p),
        )
        chosen = []
        for p in victims:
            if tokens <= free:
                break
            chosen.append(p)
            free += self.weight(p)
        if tokens > free:
            return False
        for p in chosen:
            self.demote(p, worker)
        self.fix_host(worker_id)
        return True

    def fix_host(self, worker_id: str) -> None:
        worker = self.view.workers[worker_id]
        over = self.used(worker_id, Tier.CPU) - worker.cpu_tokens
        if over <= 0:  # the usual case: nothing to rank
            return
        for p in sorted(
            (p for p in self.by_worker[worker_id] if self.tiers[p.program_id] is Tier.CPU), key=lambda p: -self.iota(p)
        ):
            if over <= 0:
                break
            self.move(p, worker_id, Tier.WAITING)
            over -= self.weight(p)


def _home(p: ProgramState) -> str:
    """The worker a program in the plan is counted on (only homed programs are in it)."""
    assert p.home_worker is not None, f"{p.program_id} has no home"
    return p.home_worker


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """maitred's GPU tier on one worker, in tokens: promotions and placement fill it up to
    ``fill``; nothing is demoted until it holds more than ``ceiling``, and then only down to
    ``ceiling`` (a band, so that a busy share that wobbles from step to step moves nobody)."""

    fill: int
    ceiling: int


def working_set_capacity(view: View) -> dict[str, TierCapacity]:
    """maitred's GPU-tier capacity per worker: how much KV may be *admitted* so that what is
    expected to be busy at once fits the GPU.

    MORI and ThunderAgent size the GPU tier as if every admitted program's KV sat on the GPU
    all the time. With HiCache write-through an idle program's KV has a host copy and comes
    back at link speed (~70 ms for 30k tokens of a 7B model at 25 GB/s), while a held request
    waits seconds. So the tier is sized by the expected busy set instead: a program is busy for
    the share ``1 − ι`` of its recent cycles (MORI's relative idleness), and ``s`` is the
    token-weighted busy share of the programs in the GPU tiers of all workers. That is the
    regime signal: agents that mostly think (SWE-agent, s ≈ 0.96) get about the GPU, agents
    that mostly wait on tools (s ≈ 0.3) up to the cap. One share serves the whole deployment:
    the regime is the workload's, and an empty worker must not look smaller than one full of
    idle programs, or placement would pile onto the latter. The tier fills to ``busy_margin / s`` × the GPU and demotes
    above ``1 / s`` × the GPU (the expected busy set exactly fills the GPU). The cap is what the
    two tiers can keep without recomputing — ``max(1, host / GPU)`` with HiCache's default
    write-through (it mirrors the GPU on the host, so host memory up to the GPU's adds no room),
    ``1 + host / GPU`` with write-back (the host takes what leaves the GPU) — plus
    ``overcommit_headroom`` GPUs' worth of KV that is recomputed when evicted without a host
    copy. Neither level goes below the GPU. Programs with no history count as busy (ι = 0), so
    a cold start is sized like ThunderAgent.

    An agent's programs on one worker share its system prompt in the radix cache, which keeps it
    once, while their weights count it once each: on a write-through worker both levels are
    raised by that over-count (the agent's prefix, ``View.agent_prefix_tokens``, for every
    program of an agent on the worker's GPU tier but the first). Measured on the replay (3,600 s,
    C = 50/80, 2× host): synthetic 863 → 912 and 867 → 916 tok/s (mean TTFT 6.81 → 5.68 s at
    C = 80), tools ×4 830 → 871, 70B synthetic 485 → 529 and 488 → 537, 70B tools ×4 449 → 497
    and 456 → 506, SWE-agent within 1% (TTFT +3–5% at H100, −6% at 70B C = 80). On write-back
    workers (host under twice the GPU) the same credit lost 12–19% at C = 80 (synthetic 856 → 738,
    tools ×4 621 → 504 tok/s): each admission it allows there costs an eviction whose copy the
    scheduler waits for, so none is given.

    Measured on the replay (3,600 s, synthetic and SWE-agent at C = 50/80 ×1, H100 and 70B
    profiles): without the band, demoting above ``fill``, maitred re-tiered ~2,900 times an
    hour at synthetic C = 80 and lost 2–5% to ThunderAgent; with it, ~400 moves and 1.01–1.11×.
    Fill margins 0.85–0.95 and headroom 0.2–0.4 measured alike; a fill margin of 1.0 loses 5% on
    SWE-agent C = 80 ×1, where a few percent of overcommit thrashes; headroom 0 loses 7% on
    synthetic C = 80 ×1 (``maitred bench replay --busy-margin M --overcommit-headroom H`` with the
    matrices' commands in BENCHMARKS.md, "Replay matrix", reruns these).
    """
    reserve, cfg, gpu = view.cfg.reserve_tokens, view.cfg, Tier.GPU  # an enum member read per program is slow on 3.11
    prefixes, sharing = view.agent_prefix_tokens, set[tuple[str | None, str]]()
    shared = dict.fromkeys(view.workers, 0)
    tokens = busy = 0.0
    for p in view.programs.values():
        home = p.home_worker
        if p.tier is gpu and home is not None and home in view.workers:
            weight = p.weight(reserve)
            tokens += weight
            busy += weight * (1 - view.signals[p.program_id].idleness)
            if (p.agent, home) in sharing:
                shared[home] += min(prefixes.get(p.agent or "", 0), p.context_tokens)
            else:
                sharing.add((p.agent, home))
    share = max(busy / tokens if tokens else 1.0, 1e-3)
    out = {}
    for worker_id, w in view.workers.items():
        host = w.cpu_tokens / w.gpu_tokens if w.gpu_tokens else 0.0
        cap = (1.0 + host if w.write_back else max(1.0, host)) + cfg.overcommit_headroom
        credit = 0 if w.write_back else shared[worker_id]
        fill, ceiling = (int(w.gpu_tokens * min(max(margin / share, 1.0), cap)) + credit for margin in (cfg.busy_margin, 1.0))
        out[worker_id] = TierCapacity(fill, ceiling)
    return out


def running_room(view: View, p: ProgramState) -> dict[str, int]:
    """Per healthy write-through worker with host memory at least its GPU's, the room ``p``'s
    request has beside the requests already running there, in the terms placement reads (the
    request fits where its weight is at most the room): ``busy_margin`` of the GPU less what
    runs, each agent's system prompt counted once, as the radix cache keeps it, and ``p``'s own
    prompt's too when its agent runs there.

    On such a worker every block on the GPU has a host copy, so the KV of an idle program in
    the GPU tier leaves for nothing and a demoted program comes back at link speed. What the
    engine cannot do without stalling is run more than its GPU holds at once: that, not the GPU
    tier, is what a request waits for there. Live (``benchmarks/bench_live.py --loads
    oversubscribed --systems maitred --duration 60``): requests of programs back from a tool
    whose KV had been demoted were held a mean 4.9 s, up to 20 s, while the requests running on
    their worker used a fifth of its GPU; admitting them here (with the agents' prefixes learned,
    ``RuntimeState._learn_prefix``) took maitred's mean TTFT from 0.20 to 0.013 s and p99 from
    5.3 to 0.15 s, and nothing was held. Write-back workers get no room here (an eviction there
    is a copy the scheduler waits for), nor workers with less host memory than GPU (a block
    evicted without a host copy is recomputed)."""
    prefixes, reserve = view.agent_prefix_tokens, view.cfg.reserve_tokens
    prefix = prefixes.get(p.agent or "", 0) if p.agent else 0
    out = {}
    for w in view.healthy_workers():
        if w.write_back or w.cpu_tokens < w.gpu_tokens:  # a GPU block may lack a host copy
            continue
        t = view.totals.worker(w.worker_id)
        agents = t.gpu_reasoning_agents
        running = t.gpu_reasoning_context - sum(prefixes.get(a, 0) * (n - 1) for a, n in agents.items() if n > 1)
        need = p.weight(reserve) - (min(prefix, p.context_tokens) if agents.get(p.agent or "", 0) > 0 else 0)
        out[w.worker_id] = int(w.gpu_tokens * view.cfg.busy_margin) - running - need + p.weight(reserve)
    return out


def plan_tiers(
    view: View,
    *,
    promote_waiting: bool,
    packing: bool = False,
    displace: bool = False,
    ceilings: Mapping[str, int] | None = None,
    held_back: Mapping[str, int] | None = None,
    plan: TierPlan | None = None,
) -> TierPlan:
    """``promote_waiting``: also bring dropped programs back at home (MORI alone); maitred
    leaves them to TAO placement, which may find them a better worker.

    ``packing`` (maitred's orders; ``mori`` stays as published): when the GPU tier is over
    capacity, demote in order of idleness *per token* (ι / weight) instead of idleness alone. Restoring a program costs in proportion to its
    size (a host load or a recompute that holds up the batch), so between two similarly idle
    programs the cheaper one to bring back should go first — ThunderAgent's smallest-first
    instinct, kept inside MORI's idleness order. Programs that want the GPU back come up
    smallest first (ThunderAgent's resume order) instead of least idle first: the room left
    takes the most waiting programs, and small contexts decode faster. Measured on the replay
    (1,200 s, synthetic C = 50 ×1): least idle first 0.95× ThunderAgent+offload, smallest first
    1.02×. A program that has just handed off is demoted last: its consumer asks as soon as the
    producer's tools end.

    ``displace``: a program that wants the GPU now squeezes out more idle ones (``make_room``).

    ``ceilings``: per worker, demote only once the GPU tier holds more than this, and only down
    to it (maitred's band, ``TierCapacity``); promotions still fill up to the worker's
    ``gpu_tokens``. Without, the two are the same.

    ``held_back``: per worker, GPU-tier tokens promotions leave free (maitred holds them for
    overdue programs that placement brings in).

    ``plan``: ``TierPlan(view)`` with no moves yet, when the caller built it already (maitred
    reads its free room first): building one walks every program.
    """
    if plan is None:
        plan = TierPlan(view)
    for worker_id in list(plan.by_worker):
        ceiling = ceilings.get(worker_id) if ceilings else None
        _plan_worker(
            plan, worker_id, promote_waiting, packing, displace, ceiling, held_back.get(worker_id, 0) if held_back else 0
        )
    return plan


def _plan_worker(
    plan: TierPlan, worker_id: str, promote_waiting: bool, packing: bool, displace: bool, ceiling: int | None, held_back: int
) -> None:
    worker = plan.view.workers[worker_id]
    for p in plan.by_worker[worker_id]:  # lazy demotions whose step has ended
        if p.lazy_demote and plan.tiers[p.program_id] is Tier.GPU and p.phase is not Phase.REASONING:
            plan.demote(p, worker)
    over = plan.used(worker_id, Tier.GPU, lazy=False) - (worker.gpu_tokens if ceiling is None else ceiling)
    if over > 0:
        over = _shed(plan, worker, over, packing)
    plan.fix_host(worker_id)
    if over <= 0:
        _promote(plan, worker, promote_waiting, packing, displace, held_back)


def _shed(plan: TierPlan, worker: WorkerState, over: int, packing: bool) -> int:
    """Demote acting GPU programs, most idle first, until ``over`` tokens have left; then mark
    reasoning ones for lazy demotion. Returns the tokens still over. Each group is ranked only
    once it is reached (a stable sort of a group keeps the order it had in a sort of both)."""
    tiers, iota, weight = plan.tiers, plan.iota, plan.weight
    rank = (lambda p: -iota(p) / max(weight(p), 1)) if packing else (lambda p: -iota(p))
    handing = {h.program_id for h in plan.view.handoffs} if packing else set()
    key = (lambda p: (p.program_id in handing, rank(p))) if handing else rank  # no handoff: rank alone
    on_gpu, reasoning = Tier.GPU, Phase.REASONING  # an enum member read per program is slow on 3.11
    acting: list[ProgramState] = []
    thinking: list[ProgramState] = []
    for p in plan.by_worker[worker.worker_id]:
        if tiers[p.program_id] is on_gpu:
            (thinking if p.phase is reasoning else acting).append(p)
    for p in sorted(acting, key=key):
        if over <= 0:
            return over
        plan.demote(p, worker)
        over -= weight(p)
    for p in sorted(thinking, key=key) if over > 0 else ():
        if over <= 0:
            break
        if tiers[p.program_id] is on_gpu and p.program_id not in plan.lazy:
            plan.moves.append(TierMove(p.program_id, worker.worker_id, Tier.GPU, Tier.CPU, lazy=True))
            plan.mark_lazy(p)
            over -= weight(p)
    return over


def _promote(plan: TierPlan, worker: WorkerState, promote_waiting: bool, packing: bool, displace: bool, held_back: int) -> None:
    """Bring programs up while the GPU tier has room: those that want it now, then those
    predicted to return (r = 1)."""
    worker_id, tiers, iota, weight = worker.worker_id, plan.tiers, plan.iota, plan.weight
    sources = (Tier.CPU, Tier.WAITING) if promote_waiting else (Tier.CPU,)
    urgent, ahead = [], []
    for p in plan.by_worker[worker_id]:
        if tiers[p.program_id] in sources:
            if p.phase is Phase.REASONING or p.returned:
                urgent.append(p)
            elif plan.view.signals[p.program_id].readiness.r == 1:
                ahead.append(p)
    urgent.sort(key=weight if packing else iota)
    ahead.sort(key=iota)
    room = worker.gpu_tokens - held_back
    for p in urgent:
        if weight(p) <= room - plan.used(worker_id, Tier.GPU) or (displace and plan.make_room(worker_id, weight(p), iota(p))):
            plan.move(p, worker_id, Tier.GPU)
    for p in ahead:
        if weight(p) <= room - plan.used(worker_id, Tier.GPU):
            plan.move(p, worker_id, Tier.GPU)
