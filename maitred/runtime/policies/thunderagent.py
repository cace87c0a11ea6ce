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
"""

from dataclasses import replace

from maitred.runtime.decisions import Assignment, Decision, TierMove
from maitred.runtime.placement import signature
from maitred.runtime.policies.base import finish
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.state import View

#: ``ThunderAgent/backend/state.py``: ``BUFFER_PER_PROGRAM``
BUFFER_PER_PROGRAM = 100


def remaining_capacity(view: View, worker_id: str, active: list[ProgramState]) -> int:
    """``BackendState.remaining_capacity`` for ``active`` programs on ``worker_id``."""
    worker = view.workers[worker_id]
    reasoning = sum(p.context_tokens for p in active if p.phase is Phase.REASONING)
    acting = sum(p.context_tokens for p in active if p.phase is not Phase.REASONING)
    shared = max(0, reasoning - worker.used_tokens) if worker.used_tokens is not None else 0
    return worker.gpu_tokens - (reasoning + acting - shared + BUFFER_PER_PROGRAM * len(active))


def _paused(p: ProgramState, tiers: dict[str, Tier], healthy: set[str]) -> bool:
    """In the global paused pool: paused from a backend, or new and waiting behind paused ones."""
    if p.home_worker is None or p.home_worker not in healthy:
        return p.phase is Phase.REASONING
    return tiers[p.program_id] is not Tier.GPU


class ThunderAgent:
    name = "thunderagent"

    def __init__(self) -> None:
        #: REASONING programs to pause when their request ends, with the start of that request
        self.marked: dict[str, float] = {}

    def step(self, view: View) -> Decision:
        healthy = {w.worker_id for w in view.healthy_workers()}
        tiers = {pid: p.tier for pid, p in view.programs.items()}
        moves: list[TierMove] = []
        for pid, since in sorted(self.marked.items()):  # their request ended since they were marked: pause
            p = view.programs.get(pid)
            if p is None:
                del self.marked[pid]
            elif p.phase is not Phase.REASONING or p.phase_since != since or tiers[pid] is not Tier.GPU:
                del self.marked[pid]
                if p.home_worker in healthy and tiers[pid] is Tier.GPU:
                    moves.append(TierMove(pid, p.home_worker, Tier.GPU, Tier.WAITING))
                    tiers[pid] = Tier.WAITING
        active = {w: [p for p in view.programs.values() if p.home_worker == w and tiers[p.program_id] is Tier.GPU]
                  for w in sorted(healthy)}
        assignments = self._greedy_resume(view, tiers, active, healthy)
        for worker_id, programs in active.items():
            moves += self._pause_until_safe(view, worker_id, programs, tiers)
        decision = finish(self.name, view, moves=moves, assignments=assignments)
        return replace(decision, admitted=decision.admitted - self.marked.keys())

    def _greedy_resume(self, view: View, tiers: dict[str, Tier], active: dict[str, list[ProgramState]],
                       healthy: set[str]) -> list[Assignment]:
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

    def _pause_until_safe(self, view: View, worker_id: str, programs: list[ProgramState],
                          tiers: dict[str, Tier]) -> list[TierMove]:
        moves: list[TierMove] = []
        remaining = remaining_capacity(view, worker_id, programs)
        acting = sorted((p for p in programs if p.phase is not Phase.REASONING),
                        key=lambda p: (p.context_tokens, p.program_id))
        reasoning = sorted((p for p in programs if p.phase is Phase.REASONING),
                           key=lambda p: (p.context_tokens, p.program_id))
        for p in acting:
            if remaining >= 0:
                return moves
            moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.WAITING))
            tiers[p.program_id] = Tier.WAITING
            remaining += p.context_tokens + BUFFER_PER_PROGRAM
        if remaining < 0:
            for p in reasoning:
                self.marked.setdefault(p.program_id, p.phase_since)
        return moves

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        """A new program's first request: assigned at once while the paused pool is empty."""
        p = view.programs[program_id]
        healthy = {w.worker_id for w in view.healthy_workers()}
        tiers = {pid: q.tier for pid, q in view.programs.items()}
        if p.home_worker is not None or any(
                _paused(q, tiers, healthy) for q in view.programs.values() if q.program_id != program_id):
            return None
        need = p.context_tokens + BUFFER_PER_PROGRAM
        fits = []
        for w in sorted(healthy):
            programs = [q for q in view.programs.values() if q.home_worker == w and tiers[q.program_id] is Tier.GPU]
            if remaining_capacity(view, w, programs) >= need:
                fits.append((sum(q.context_tokens for q in programs), w))
        if not fits:
            return None
        worker_id = min(fits)[1]
        return Decision(self.name, assignments=(Assignment(program_id, worker_id, "new", signature(p)),),
                        admitted=frozenset({program_id}))
