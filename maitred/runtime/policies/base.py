"""What every policy is: a name and ``step(view) -> Decision`` (plus shared finishing touches).

Policies may keep small memory of their own between steps (a round-robin cursor) but never
mutate the view; everything they decide is in the returned ``Decision``.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

from maitred.runtime.decisions import Assignment, Decision, TierMove, Warmup
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.state import View

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison


class Policy(Protocol):
    name: str

    def step(self, view: View) -> Decision: ...


def pause_until_fits(
    view: View, order: "Callable[[ProgramState, str], SupportsRichComparison]",
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
            (p for p in view.programs.values()
             if p.home_worker == worker_id and tiers[p.program_id] is Tier.GPU and p.phase is not Phase.REASONING),
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
    name: str, view: View, *, moves: Iterable[TierMove] = (), assignments: Iterable[Assignment] = (),
    warmups: Iterable[Warmup] = (), admit_all: bool = False, dp_fallback: bool | None = None,
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
        policy=name, tier_moves=moves, assignments=assignments, admitted=admitted,
        held=frozenset(wanting - admitted), warmups=tuple(warmups), priorities=priorities(view, tiers),
        dp_fallback=dp_fallback,
    )
