"""TAO's joint placement: value every (program, worker) pair, then choose all at once.

Each pair gets the value (k, r, t) — cache credit on that worker, readiness, context tokens —
compared lexicographically; the plan maximises the component-wise sum, lexicographically,
subject to each worker's free GPU tokens and one worker per program. That is a multiple
knapsack; ``solve_dp`` solves it exactly over capacities discretised by a quantum (weights
rounded up, capacities down, so a DP plan is always feasible), vectorised with numpy: each
layer holds every reachable vector of used quanta with its best value. Past a state budget it
gives up and ``solve_bfd`` (best-fit decreasing) decides instead. The budget counts every state
the DP creates, so the worst case is bounded: a step never spends more than that on placement.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from maitred.runtime.decisions import Assignment, Signature
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.signals import cache_credit
from maitred.runtime.state import View

Value = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Item:
    """A candidate: its weight and its value on each worker (None: not eligible there)."""

    key: str
    weight: int
    values: tuple[Value | None, ...]

    def on(self, b: int) -> Value:
        """The value on a worker the plan chose, where the item is eligible by construction."""
        value = self.values[b]
        if value is None:
            raise ValueError(f"{self.key} is not eligible on worker {b}")
        return value


def solve_dp(items: list[Item], capacities: list[int], *, quanta: int, state_budget: int) -> list[int | None] | None:
    """Exact lexicographic optimum over the discretised capacities: the worker index chosen
    for each item (None: not placed), or None when the states created exceed ``state_budget``."""
    m = len(capacities)
    if not items or m == 0:
        return [None] * len(items)
    spent = 0
    quantum = max(1, math.ceil(max(capacities) / quanta)) if max(capacities) > 0 else 1
    cap = np.array([max(c, 0) // quantum for c in capacities], dtype=np.int64)
    radix = np.cumprod(np.concatenate(([1], cap[:-1] + 1))).astype(np.int64)
    width = (
        len(next(v for item in items for v in item.values if v is not None))
        if any(v is not None for item in items for v in item.values)
        else 1
    )
    used = np.zeros((1, m), dtype=np.int64)
    value = np.zeros((1, width), dtype=np.int64)
    layers: list[tuple[np.ndarray, np.ndarray]] = []
    for item in items:
        w = math.ceil(item.weight / quantum)
        blocks_used, blocks_value, parents, choices = [used], [value], [np.arange(len(used))], [np.full(len(used), -1)]
        for b, v in enumerate(item.values):
            if v is None:
                continue
            fits = used[:, b] + w <= cap[b]
            if not fits.any():
                continue
            idx = np.nonzero(fits)[0]
            nu = used[idx].copy()
            nu[:, b] += w
            blocks_used.append(nu)
            blocks_value.append(value[idx] + np.array(v, dtype=np.int64))
            parents.append(idx)
            choices.append(np.full(len(idx), b))
        all_used, all_value = np.concatenate(blocks_used), np.concatenate(blocks_value)
        all_parent, all_choice = np.concatenate(parents), np.concatenate(choices)
        keys = all_used @ radix
        # Per distinct state keep the lexicographically best value (ties: the earlier candidate).
        order = np.lexsort(tuple(-all_value[:, c] for c in reversed(range(width))) + (keys,))
        first = np.ones(len(order), dtype=bool)
        first[1:] = keys[order][1:] != keys[order][:-1]
        keep = order[first]
        spent += len(keep)
        if spent > state_budget:
            return None
        used, value = all_used[keep], all_value[keep]
        layers.append((all_parent[keep], all_choice[keep]))
    best = int(np.lexsort(tuple(value[:, c] for c in reversed(range(width))))[-1])
    plan: list[int | None] = [None] * len(items)
    for j in range(len(items) - 1, -1, -1):
        parent, choice = layers[j]
        plan[j] = None if choice[best] < 0 else int(choice[best])
        best = int(parent[best])
    return plan


def solve_bfd(items: list[Item], capacities: list[int]) -> list[int | None]:
    """Best-fit decreasing: heaviest first, each into the eligible worker it fills most tightly
    (ties: more value there)."""
    free = list(capacities)
    plan: list[int | None] = [None] * len(items)
    for j in sorted(range(len(items)), key=lambda j: -items[j].weight):
        item = items[j]
        fitting = [b for b, v in enumerate(item.values) if v is not None and item.weight <= free[b]]
        if fitting:
            b = min(fitting, key=lambda b: (free[b] - item.weight, tuple(-x for x in item.on(b))))
            plan[j] = b
            free[b] -= item.weight
    return plan


def plan_items(items: list[Item], capacities: list[int], quanta: int, state_budget: int) -> tuple[list[int | None], bool]:
    """The exact DP over as many of the most valuable candidates as the state budget can
    guarantee to hold (the product of their choices bounds the states), then BFD for the rest
    in what capacity is left. Returns the plan and whether any candidate was left to BFD."""
    order = sorted(
        range(len(items)), key=lambda j: max((v for v in items[j].values if v is not None), default=(-1,)), reverse=True
    )
    head, layer, spent = [], 1, 0
    for j in order:
        choices = 1 + sum(v is not None for v in items[j].values)
        if spent + layer * choices > state_budget:
            break
        layer *= choices
        spent += layer
        head.append(j)
    head_plan = solve_dp([items[j] for j in head], capacities, quanta=quanta, state_budget=state_budget)
    assert head_plan is not None, "the head was sized to fit the budget"
    plan: list[int | None] = [None] * len(items)
    free = list(capacities)
    for j, b in zip(head, head_plan):
        plan[j] = b
        if b is not None:
            free[b] -= items[j].weight
    in_head = set(head)
    tail = [j for j in order if j not in in_head]
    for j, b in zip(tail, solve_bfd([items[j] for j in tail], free)):
        plan[j] = b
    return plan, bool(tail)


def objective(items: list[Item], plan: list[int | None]) -> Value:
    """Component-wise sum of the chosen values (what the DP maximises lexicographically)."""
    width = max((len(v) for item in items for v in item.values if v is not None), default=0)
    total = [0] * width
    for item, b in zip(items, plan):
        if b is not None:
            for i, x in enumerate(item.on(b)):
                total[i] += x
    return tuple(total)


def signature(p: ProgramState) -> Signature:
    return (p.phase, p.context_tokens, p.tier, p.home_worker, p.tool.call_id if p.tool else None, p.returned)


def wants_gpu(p: ProgramState, view: View) -> bool:
    return p.phase is Phase.REASONING or view.signals[p.program_id].readiness.r == 1


@dataclass(frozen=True, slots=True)
class Placement:
    assignments: tuple[Assignment, ...]
    fallback: bool


def place(view: View, candidates: list[ProgramState], free: dict[str, int], *, reason: dict[str, str] | None = None) -> Placement:
    """Choose workers for ``candidates`` within ``free`` GPU tokens per worker."""
    worker_ids = [w for w in free if view.workers[w].healthy]
    capacities = [max(free[w], 0) for w in worker_ids]
    reserve, cfg = view.cfg.reserve_tokens, view.cfg
    versions = dict(view.adapter_versions)
    items = []
    for p in candidates:
        r = view.signals[p.program_id].readiness.r
        weight = p.weight(reserve)
        # TAO's (k, r, t), then the worker's free room in 1k-token units: among plans equal on
        # cache, readiness and tokens, prefer emptier workers (spread the load).
        values = tuple(
            (cache_credit(p, w, view.now, cfg.credit_half_life_s, versions), r, p.context_tokens, cap // 1024)
            if weight <= cap
            else None
            for w, cap in zip(worker_ids, capacities)
        )
        items.append(Item(p.program_id, weight, values))
    plan, fallback = plan_items(items, capacities, cfg.dp_quanta, cfg.dp_state_budget)
    by_id = {p.program_id: p for p in candidates}
    # Highest value first, so that applying a prefix of the plan keeps the most valuable part.
    chosen = sorted(((items[j], b) for j, b in enumerate(plan) if b is not None), key=lambda ib: ib[0].on(ib[1]), reverse=True)
    assignments = tuple(
        Assignment(item.key, worker_ids[b], (reason or {}).get(item.key, "waiting"), signature(by_id[item.key]))
        for item, b in chosen
    )
    return Placement(assignments, fallback)


def applicable_prefix(
    assignments: tuple[Assignment, ...], view: View, free: dict[str, int], moved: Mapping[str, Tier] | None = None
) -> tuple[Assignment, ...]:
    """TAO's re-check before applying a plan computed on an older snapshot: walk the plan in
    order and stop at the first step whose program changed (signature), left, became
    ineligible, or no longer fits its worker's live free tokens. ``moved``: the tier the plan's
    own moves, applied first, gave a program (a program the plan demotes and then places
    elsewhere has not changed)."""
    left = dict(free)
    out: list[Assignment] = []
    for a in assignments:
        p = view.programs.get(a.program_id)
        worker = view.workers.get(a.worker)
        expected = a.signature
        if moved and a.program_id in moved:
            expected = expected[:2] + (moved[a.program_id],) + expected[3:]  # signature()'s tier
        if p is None or worker is None or not worker.healthy or signature(p) != expected:
            break
        weight = p.weight(view.cfg.reserve_tokens)
        if weight > left.get(a.worker, 0):
            break
        left[a.worker] -= weight
        out.append(a)
    return tuple(out)


def candidates_for_placement(
    view: View, tiers: dict[str, Tier], free: dict[str, int]
) -> tuple[list[ProgramState], dict[str, str]]:
    """TAO's waiting pool: new programs, dropped (waiting) programs and returning host-tier
    programs that no longer fit at home — each only when it wants the GPU (asked last: it may
    predict a tool's end, which most programs, at home in the GPU tier, never need)."""
    reserve = view.cfg.reserve_tokens
    waiting, cpu = Tier.WAITING, Tier.CPU  # an enum member read per program is slow on 3.11
    out, reason = [], {}
    for p in view.programs.values():
        tier = tiers.get(p.program_id, p.tier)
        if p.home_worker is None or p.home_worker not in free:
            why = "new" if p.home_worker is None else "failover"
        elif tier is waiting:
            why = "waiting"
        elif tier is cpu and p.weight(reserve) > free[p.home_worker]:
            why = "returning"
        else:
            continue
        if wants_gpu(p, view):
            out.append(p)
            reason[p.program_id] = why
    return out, reason
