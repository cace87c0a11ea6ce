"""maitred: MORI's tiers, TAO's placement and readiness, LOCAL's pre-prefill, composed.

0. The GPU tier is sized by the expected busy set, not the GPU (``working_set_capacity``):
   the busy share of the admitted programs is how maitred reads the regime — mostly thinking
   agents get ThunderAgent's capacity, mostly waiting ones as much as GPU and host can keep.
1. Tiering (MORI) per worker, by relative idleness, demoting in order of idleness per token
   (cheaper-to-restore programs first among the idle), bringing back the smallest of those
   that want the GPU first; dropped programs are left to step 2.
2. Placement (TAO) of the waiting pool — new, dropped, and returning programs that no longer
   fit at home — by the exact DP over (cache credit, readiness, tokens), BFD past its budget.
   A program of that pool whose request has waited over ``OVERDUE_S`` is placed first, in
   room that step 1's promotions leave for it; room it cannot use yet goes to the rest of the
   pool (``_overdue``).
3. Pre-prefill (LOCAL + TAO): warm the consumers of handoffs and the programs about to return
   whose KV is not on their worker's GPU (``preprefill.choose_warmups`` says where and when).
"""

from dataclasses import replace

from maitred.runtime.admission import HOLD_TIMEOUT_S, Cadence
from maitred.runtime.decisions import Assignment, Decision, TierMove, Warmup
from maitred.runtime.placement import candidates_for_placement, place
from maitred.runtime.policies.base import final_tiers, finish, healthy_free
from maitred.runtime.preprefill import choose_warmups, propose
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.state import View
from maitred.runtime.tiering import TierPlan, plan_tiers, running_room, working_set_capacity


class Maitred:
    name = "maitred"
    #: a step every second and 50 ms after a request is held (the gateway steps on every event);
    #: a 5 s period measured the same on the H100 profile but lost a third of the throughput on
    #: the 70B one (SWE-agent C=80 ×1, 1,200 s: 427 against 662 tok/s)
    cadence = Cadence(period_s=1.0, hold_s=HOLD_TIMEOUT_S, urgent_s=0.05)

    def __init__(self, *, preprefill: bool = True) -> None:
        self.preprefill = preprefill

    @property
    def warms(self) -> bool:
        """Whether the policy proposes warmups (LOCAL's pre-prefill), so a driver keeps prompts."""
        return self.preprefill

    def step(self, view: View) -> Decision:
        planned, ceilings = _sized(view)
        overdue, start = _overdue(planned), TierPlan(planned)
        tiers = plan_tiers(
            planned,
            promote_waiting=False,
            packing=True,
            ceilings=ceilings,
            held_back=_room_for(planned, overdue, start.gpu_free()),
            plan=start,
        )
        free = tiers.gpu_free()
        candidates, reason = candidates_for_placement(planned, tiers.tiers, free)
        first = place(planned, overdue, free, reason=reason)
        left = _after(view, first.assignments, free)
        placed = {a.program_id for a in first.assignments}
        rest = place(planned, [p for p in candidates if p.program_id not in placed], left, reason=reason)
        placement = replace(rest, assignments=first.assignments + rest.assignments, fallback=first.fallback or rest.fallback)
        planned_tiers = final_tiers(view, tiers.moves, placement.assignments)
        warmups: tuple[Warmup, ...] = ()
        if self.preprefill:
            left = _after(view, rest.assignments, left)
            warmups = choose_warmups(view, propose(view, placement.assignments), left, planned_tiers)
        decision = finish(
            self.name,
            view,
            moves=tiers.moves,
            assignments=placement.assignments,
            warmups=warmups,
            dp_fallback=placement.fallback if candidates else None,
            tiers=planned_tiers,
        )
        return replace(decision, tier_tokens={w.worker_id: w.gpu_tokens for w in planned.healthy_workers()})

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        """A request goes in at once when it fits what the GPU tier (as the last step sized it)
        has free now, or, on a write-through worker, the GPU beside the requests running there
        (``running_room``), without moving anything:

        - a program with a healthy home whose KV is in host memory or dropped goes back to that
          home's GPU tier (affinity; no wait for a step: holding costs time to first token at
          low load); one whose KV is in host memory also when it fits beside what runs there;
        - a new program is placed (TAO's value over the workers) when it also jumps no queue (no
          other program that wants the GPU is outside a GPU tier).

        Otherwise the step places it with the waiting pool; the drivers ask for one at once
        (``cadence.urgent_s``). Waiting for a step cost a first request the period: 0.07 against
        ThunderAgent's 0.06 s mean TTFT at synthetic C = 20, where ThunderAgent admits at arrival.
        Beyond its tier a program's GPU tier is over its ceiling, and the next step demotes the
        most idle programs there, as it does whenever the busy share rises."""
        p = view.programs[program_id]
        free = healthy_free(view, tier_tokens=True)
        weight = p.weight(view.cfg.reserve_tokens)
        if p.home_worker in free:
            if p.tier is Tier.GPU:
                return None
            if weight > free[p.home_worker] and (p.tier is not Tier.CPU or weight > running_room(view, p).get(p.home_worker, 0)):
                return None
            return Decision(
                self.name, tier_moves=(TierMove(program_id, p.home_worker, p.tier, Tier.GPU),), admitted=frozenset({program_id})
            )
        others = view.totals.wanting_off_gpu - (p.phase is Phase.REASONING and p.tier is not Tier.GPU)
        if others > 0:
            return None
        reason = {program_id: "new" if p.home_worker is None else "failover"}
        placement = place(view, [p], free, reason=reason)
        if not placement.assignments:
            placement = place(view, [p], running_room(view, p), reason=reason)
        if not placement.assignments:
            return None
        return Decision(self.name, assignments=placement.assignments, admitted=frozenset({program_id}))


#: a request of a program left to placement that has waited this long gets room held for it
OVERDUE_S = 10.0


def _overdue(view: View) -> list[ProgramState]:
    """Programs left to placement (new, dropped, or whose worker failed) whose request has
    waited over ``OVERDUE_S``, oldest first.

    Promotions of homed programs (step 1) take the room before placement sees it, smallest
    first, so under steady load a new program could wait until the hold bound forced it in:
    on the H200 profile at synthetic C = 80 ×1, 210 first requests waited over 100 s, one
    1,794 s, and maitred's mean TTFT was 2.31 s against ThunderAgent+offload's 1.92 s (its new
    programs queue behind its paused ones only). Holding room for the overdue ones and placing
    them first: 1.98 s; on the H100 synthetic workload 7.35 → 6.48 s at C = 80 ×1 and on
    SWE-agent 5.11 → 4.34 s, throughput within 2%. The held room is kept from promotions only:
    an overdue program that does not fit yet lets younger ones of the pool into it, because
    keeping it empty until it fits measured worse (mean TTFT at C = 80 up 8–14% in four of
    eight cells: synthetic, SWE-agent, tools ×4, H200). Large *homed* programs can still wait long
    behind smaller returning ones; displacing GPU-tier programs for them (MORI's rule) was
    tried and churned (mean TTFT 3.80 s, a quarter fewer requests served)."""
    reasoning, waiting = Phase.REASONING, Tier.WAITING  # an enum member read per program is slow on 3.11
    return sorted(
        (
            p
            for p in view.programs.values()
            if p.phase is reasoning
            and view.now - p.phase_since > OVERDUE_S
            and (p.home_worker not in view.workers or p.tier is waiting)
        ),
        key=lambda p: p.phase_since,
    )


def _room_for(view: View, programs: list[ProgramState], room: dict[str, int]) -> dict[str, int]:
    """GPU-tier tokens to keep free per worker for ``programs``, each on the worker that has
    the most ``room`` (free GPU-tier tokens before this step's moves; taken from as it goes)
    left for it."""
    held = dict[str, int]()
    for p in programs:
        if not room:
            break
        worker = max(room, key=room.__getitem__)
        room[worker] -= p.weight(view.cfg.reserve_tokens)
        held[worker] = held.get(worker, 0) + p.weight(view.cfg.reserve_tokens)
    return held


def _after(view: View, assignments: tuple[Assignment, ...], free: dict[str, int]) -> dict[str, int]:
    """``free`` less what ``assignments`` take."""
    left = dict(free)
    for a in assignments:
        left[a.worker] -= view.programs[a.program_id].weight(view.cfg.reserve_tokens)
    return left


def _sized(view: View) -> tuple[View, dict[str, int]]:
    """The view with each worker's GPU tier at its working-set fill level, and the ceilings."""
    caps = working_set_capacity(view)
    workers = {wid: replace(w, gpu_tokens=caps[wid].fill) for wid, w in view.workers.items()}
    return replace(view, workers=workers), {wid: c.ceiling for wid, c in caps.items()}
