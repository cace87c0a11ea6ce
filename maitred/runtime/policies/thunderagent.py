"""ThunderAgent's scheduler, as published, the baseline to beat (no host tier of its own).

Every rule follows ThunderAgent-org/ThunderAgent (paths below are in that repository):

- Capacity (``ThunderAgent/backend/state.py``): a backend's remaining capacity is its KV
  capacity (SGLang's ``max_total_num_tokens``) minus the tokens of its active programs, with
  acting tokens at weight 1.0 (``config.py``: ``acting_token_weight``, no decay), minus a buffer
  of ``BUFFER_PER_PROGRAM`` = 100 tokens per active program, plus the tokens reasoning programs
  share (``max(0, reasoning tokens − the engine's own token usage)``).
- The periodic check (``ThunderAgent/scheduler/router.py`` ``_scheduled_check``, every
  ``scheduler_interval`` = 5 s): first ``_greedy_resume``, then ``_pause_until_safe`` on every
  backend over capacity.
- ``_pause_until_safe``: while over capacity, pause the smallest ACTING program (it leaves the
  backend for the global paused pool; this is router bookkeeping only, the engine is not told
  to free its KV, its own LRU evicts it); with none left, *mark* the smallest unmarked
  REASONING program, which is paused when its current request ends. Marking frees nothing, so
  the loop goes on marking every reasoning program of a backend still over capacity.
- ``_greedy_resume``: the total remaining capacity of backends with more than 100 tokens left;
  candidates from the paused pool in groups — paused with a pending request, then new programs,
  then paused acting ones — each smallest first, taken while the running total of
  (tokens + 100) fits; then placed largest first on the backend with the most remaining
  capacity, skipping one that fits none. Where a program's cache was plays no part.
- New programs are assigned when their first request arrives, to the backend with the fewest
  active tokens among those with room for tokens + 100, but only while the paused pool is
  empty; otherwise they queue behind the paused ones (``admit_at_arrival``).
- ``_wait_for_resume(timeout=1800.0)`` in ``router.py``: a paused request is let through after
  1,800 s (``cadence``).

The marks are kept in the state, not in the policy: a mark is a lazy tier move (``lazy_since``
is the start of the marked request), so the gateway and the replay see the same marks.
"""

from dataclasses import replace

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Assignment, Decision, TierMove
from maitred.runtime.placement import signature
from maitred.runtime.policies.base import assign_now, finish
from maitred.runtime.records import Phase, ProgramState, Tier, WorkerState
from maitred.runtime.state import View

#: ``ThunderAgent/backend/state.py``: ``BUFFER_PER_PROGRAM``
BUFFER_PER_PROGRAM = 100


def remaining_capacity(view: View, worker_id: str, active: list[ProgramState]) -> int:
    """``BackendState.remaining_capacity`` for ``active`` programs on ``worker_id``."""
    reasoning = sum(p.context_tokens for p in active if p.phase is Phase.REASONING)
    acting = sum(p.context_tokens for p in active if p.phase is not Phase.REASONING)
    return _remaining(view.workers[worker_id], reasoning, acting, len(active))


def _remaining(worker: WorkerState, reasoning: int, acting: int, programs: int) -> int:
    shared = max(0, reasoning - worker.used_tokens) if worker.used_tokens is not None else 0
    return worker.gpu_tokens - (reasoning + acting - shared + BUFFER_PER_PROGRAM * programs)


def _paused(p: ProgramState, tiers: dict[str, Tier], healthy: set[str]) -> bool:
    """In the global paused pool: paused from a backend, or new and waiting behind paused ones."""
    if p.home_worker is None or p.home_worker not in healthy:
        return p.phase is Phase.REASONING
    return tiers[p.program_id] is not Tier.GPU


def _mark_ended(p: ProgramState) -> bool:
    """A marked program whose marked request has ended (it may have sent another since)."""
    return p.phase is not Phase.REASONING or p.phase_since != p.lazy_since


class ThunderAgent:
    name = "thunderagent"
    warms = False  # proposes no warmups
    cadence = Cadence(period_s=5.0, hold_s=1800.0)  # config.py scheduler_interval; router.py _wait_for_resume

    def step(self, view: View) -> Decision:
        healthy = {w.worker_id for w in view.healthy_workers()}
        tiers = {pid: p.tier for pid, p in view.programs.items()}
        moves: list[TierMove] = []
        marked = set()
        for pid in sorted(pid for pid, p in view.programs.items() if p.lazy_demote and p.tier is Tier.GPU):
            p = view.programs[pid]
            if not _mark_ended(p):
                marked.add(pid)
            elif p.home_worker in healthy:  # its request ended since it was marked: pause
                moves.append(TierMove(pid, p.home_worker, Tier.GPU, Tier.WAITING))
                tiers[pid] = Tier.WAITING
        active = {
            w: [p for p in view.programs.values() if p.home_worker == w and tiers[p.program_id] is Tier.GPU]
            for w in sorted(healthy)
        }
        assignments = self._greedy_resume(view, tiers, active, healthy)
        for worker_id, programs in active.items():
            moves += self._pause_until_safe(view, worker_id, programs, tiers, marked)
        decision = finish(self.name, view, moves=moves, assignments=assignments)
        return replace(decision, admitted=decision.admitted - marked, withheld=frozenset(marked))

    def _greedy_resume(
        self, view: View, tiers: dict[str, Tier], active: dict[str, list[ProgramState]], healthy: set[str]
    ) -> list[Assignment]:
        room = {w: remaining_capacity(view, w, programs) for w, programs in active.items()}
        room = {w: r for w, r in room.items() if r > BUFFER_PER_PROGRAM}
        total = sum(room.values())
        if total <= 0:
            return []
        pool = [p for p in view.programs.values() if _paused(p, tiers, healthy)]

        def group(p: ProgramState) -> int:
            if p.home_worker is None or p.home_worker not in healthy:
                return 1
            return 0 if p.phase is Phase.REASONING else 2

        selected, cumulative = [], 0
        for p in sorted(pool, key=lambda p: (group(p), p.context_tokens, p.program_id)):
            need = p.context_tokens + BUFFER_PER_PROGRAM
            if cumulative + need <= total:
                selected.append(p)
                cumulative += need
        assignments = []
        for p in sorted(selected, key=lambda p: (-p.context_tokens, p.program_id)):
            if not room:
                break
            worker_id = max(sorted(room), key=room.__getitem__)
            need = p.context_tokens + BUFFER_PER_PROGRAM
            if need > room[worker_id]:
                continue
            room[worker_id] -= need
            active[worker_id].append(p)
            tiers[p.program_id] = Tier.GPU
            reason = "new" if p.home_worker is None else "waiting"
            assignments.append(Assignment(p.program_id, worker_id, reason, signature(p)))
        return assignments

    def _pause_until_safe(
        self, view: View, worker_id: str, programs: list[ProgramState], tiers: dict[str, Tier], marked: set[str]
    ) -> list[TierMove]:
        moves: list[TierMove] = []
        remaining = remaining_capacity(view, worker_id, programs)
        acting = sorted((p for p in programs if p.phase is not Phase.REASONING), key=lambda p: (p.context_tokens, p.program_id))
        reasoning = sorted((p for p in programs if p.phase is Phase.REASONING), key=lambda p: (p.context_tokens, p.program_id))
        for p in acting:
            if remaining >= 0:
                return moves
            moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.WAITING))
            tiers[p.program_id] = Tier.WAITING
            remaining += p.context_tokens + BUFFER_PER_PROGRAM
        if remaining < 0:
            for p in reasoning:
                if p.program_id not in marked:
                    marked.add(p.program_id)
                    moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.WAITING, lazy=True, since=p.phase_since))
        return moves

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        """A new program's first request: assigned at once while the paused pool is empty, to
        the backend with the fewest active tokens among those with room (from the totals)."""
        p = view.programs[program_id]
        if p.home_worker is not None:
            return None
        totals = view.totals
        healthy = sorted(w.worker_id for w in view.healthy_workers())
        paused = totals.homeless_wanting - (p.phase is Phase.REASONING) + sum(totals.worker(w).homed_off_gpu for w in healthy)
        if paused > 0:
            return None
        need = p.context_tokens + BUFFER_PER_PROGRAM
        fits = []
        for w in healthy:
            t = totals.worker(w)
            active = t.gpu_reasoning_context + t.gpu_acting_context
            if _remaining(view.workers[w], t.gpu_reasoning_context, t.gpu_acting_context, t.gpu_programs) >= need:
                fits.append((active, w))
        return assign_now(self.name, p, min(fits)[1]) if fits else None
