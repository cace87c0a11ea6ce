"""What every policy is: a name, a cadence, ``step(view) -> Decision`` and an arrival rule
(plus shared finishing touches).

Policies keep no memory between steps: what they remember (a round-robin cursor, ThunderAgent's
marks) lives in the state they are given, so the gateway and the replay, which hand them the
same state, get the same decisions. They never mutate the view; everything they decide is in
the returned ``Decision``.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Assignment, Decision, TierMove, Warmup
from maitred.runtime.placement import signature
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.state import View

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison


class Policy(Protocol):
    name: str
    cadence: Cadence

    @property
    def warms(self) -> bool:
        """Whether the policy ever proposes warmups (a driver keeps prompts only then)."""
        ...

    def step(self, view: View) -> Decision: ...

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        """A request of ``program_id`` just arrived and its program is not in a GPU tier (or has
        no healthy home): the decision that lets it run now, or None (it waits for a step).
        Runs on the gateway's event loop for every such request, so it reads only the arriving
        program and ``view.totals`` — never every program."""
        ...


def healthy_free(view: View, *, tier_tokens: bool) -> dict[str, int]:
    """GPU-tier tokens free on each healthy worker, from the totals: the worker's GPU (or, with
    ``tier_tokens``, the GPU tier the last step planned) less its GPU-tier programs' weight."""
    out = {}
    for w in view.healthy_workers():
        size = view.tier_tokens.get(w.worker_id, w.gpu_tokens) if tier_tokens else w.gpu_tokens
        out[w.worker_id] = size - view.totals.worker(w.worker_id).gpu_weight
    return out


def assign_now(name: str, p: ProgramState, worker: str, reason: str = "new") -> Decision:
    """The arrival decision that places ``p`` on ``worker`` and lets its request run."""
    return Decision(
        name, assignments=(Assignment(p.program_id, worker, reason, signature(p)),), admitted=frozenset({p.program_id})
    )


def pause_until_fits(
    view: View,
    order: "Callable[[ProgramState, str], SupportsRichComparison]",
) -> tuple[dict[str, Tier], dict[str, int], list[TierMove]]:
    """Interrupt/pause without a host tier (ThunderAgent, TAO): on each worker over capacity,
    acting GPU programs leave (KV given up) in ``order(program, worker)`` until it fits.
    Returns the tiers after the pauses, the free GPU tokens per healthy worker and the moves."""
    reserve = view.cfg.reserve_tokens
    tiers = {pid: p.tier for pid, p in view.programs.items()}
    free = {w.worker_id: w.gpu_tokens for w in view.healthy_workers()}
    for p in view.programs.values():
        if tiers[p.program_id] is Tier.GPU and p.home_worker in free:
            free[p.home_worker] -= p.weight(reserve)
    moves: list[TierMove] = []
    for worker_id in free:
        acting = sorted(
            (
                p
                for p in view.programs.values()
                if p.home_worker == worker_id and tiers[p.program_id] is Tier.GPU and p.phase is not Phase.REASONING
            ),
            key=lambda p: order(p, worker_id),
        )
        for p in acting:
            if free[worker_id] >= 0:
                break
            moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.WAITING))
            tiers[p.program_id] = Tier.WAITING
            free[worker_id] += p.weight(reserve)
    return tiers, free, moves


def final_tiers(view: View, moves: Iterable[TierMove], assignments: Iterable[Assignment]) -> dict[str, Tier]:
    tiers = {pid: p.tier for pid, p in view.programs.items()}
    for m in moves:
        if not m.lazy:
            tiers[m.program_id] = m.dst
    for a in assignments:
        tiers[a.program_id] = Tier.GPU
    return tiers


def priorities(view: View, tiers: Mapping[str, Tier]) -> dict[str, int]:
    """SGLang request priority for ``--radix-eviction-policy priority`` (higher = evicted
    later): GPU-tier programs above host-tier ones, and within a tier the less idle higher."""
    top = {Tier.GPU: 200, Tier.CPU: 100, Tier.WAITING: 0}  # each tier's band is the 100 below
    signals = view.signals
    return {pid: top[tiers[pid]] - round(100 * signals[pid].idleness) for pid in view.programs}


def finish(
    name: str,
    view: View,
    *,
    moves: Iterable[TierMove] = (),
    assignments: Iterable[Assignment] = (),
    warmups: Iterable[Warmup] = (),
    admit_all: bool = False,
    dp_fallback: bool | None = None,
    tiers: Mapping[str, Tier] | None = None,
) -> Decision:
    """Assemble a decision: who may run now (GPU tier, or everyone for policies without
    admission control) and who is held (wants the GPU but is not admitted). ``tiers``:
    ``final_tiers`` of these moves and assignments, when the caller has it already."""
    moves, assignments = tuple(moves), tuple(assignments)
    if tiers is None:
        tiers = final_tiers(view, moves, assignments)
    gpu, reasoning = Tier.GPU, Phase.REASONING  # an enum member read per program is slow on 3.11
    homed = {pid for pid, p in view.programs.items() if p.home_worker is not None} | {a.program_id for a in assignments}
    if admit_all:
        admitted = frozenset(homed)
    else:
        admitted = frozenset({pid for pid in homed if tiers[pid] is gpu})
    wanting = {pid for pid, p in view.programs.items() if p.phase is reasoning}
    return Decision(
        policy=name,
        tier_moves=moves,
        assignments=assignments,
        admitted=admitted,
        held=frozenset(wanting - admitted),
        warmups=tuple(warmups),
        priorities=priorities(view, tiers),
        dp_fallback=dp_fallback,
    )
