"""One test per published rule the replay's engine and baselines follow (sources in the modules:
maitred/sim/engine.py, maitred/runtime/policies/thunderagent.py, mori.py, maitred/runtime/tiering.py,
maitred/sim/replay.py), and the review fixes of the engine and the tier plan."""

import pytest

from maitred.runtime import Phase, Scheduler, Tier
from maitred.runtime.policies.thunderagent import BUFFER_PER_PROGRAM, ThunderAgent, remaining_capacity
from maitred.runtime.tiering import plan_tiers
from maitred.sim.engine import Request, WorkerModel
from maitred.sim.profile import EngineProfile
from maitred.sim.replay import SIM_POLICIES, RunConfig
from tests.runtime_helpers import NOW, program, state

PROFILE = EngineProfile()


def finish(w: WorkerModel, req: Request, t: float = 0.0) -> Request:
    w.submit(req, t)
    while req.done_at is None:
        nxt = w.next_event_time()
        assert nxt is not None
        w.advance(nxt)
    return req


def req(pid: str, context: int, output: int = 10, **kw) -> Request:
    return Request(pid, "a", context, output, 0.0, **kw)


# -- engine: HiCache --------------------------------------------------------------------------


def test_write_through_leaves_a_host_copy_of_every_cached_block():
    w = WorkerModel("w", PROFILE, gpu_tokens=100_000, host_tokens=200_000, offload=True)
    finish(w, req("p", 5_000))
    seg = w.segments["p"]
    assert seg.gpu == 5_010 and seg.host == 5_010 and w.host_used == 5_010


def test_gpu_eviction_writes_nothing_and_loads_back_what_write_through_saved():
    """p's 9,010 tokens were written through when cached; q's 8,000 need room, so p loses the
    GPU tail (a partial eviction): no bytes move then, and p's next prompt loads the evicted
    part back from host memory instead of recomputing it."""
    w = WorkerModel("w", PROFILE, gpu_tokens=12_000, host_tokens=50_000, offload=True)
    finish(w, req("p", 9_000))
    moved = w.stats.transfer_bytes
    finish(w, req("q", 2_000, output=1_500), t=w.t)
    assert w.stats.transfer_bytes == moved + 3_500 * PROFILE.kv_bytes_per_token  # q's own write-through only
    seg = w.segments["p"]
    assert 0 < seg.gpu < 9_010 and seg.host == 9_010
    gpu_part = seg.gpu
    again = finish(w, req("p", 9_010, output=1), t=w.t)
    assert again.recomputed == 0 and again.host_hit_tokens == 9_010 - gpu_part


def test_a_block_evicted_without_a_host_copy_is_gone():
    """The host pool is full of the host copies of GPU-resident KV, which stock host eviction
    may not take: p's copy is not made, and once the GPU evicts p, p recomputes."""
    w = WorkerModel("w", PROFILE, gpu_tokens=20_000, host_tokens=6_000, offload=True)
    finish(w, req("q", 5_990))
    finish(w, req("p", 5_990), t=w.t)
    assert w.segments["q"].host == 6_000 and w.segments["p"].host == 0
    finish(w, req("r", 13_000, output=0), t=w.t)  # r and s push q, then p, off the GPU (LRU)
    finish(w, req("s", 13_000, output=0), t=w.t)
    assert w.segments["p"].gpu == 0 and w.segments["p"].host == 0
    again = finish(w, req("p", 6_000, output=1), t=w.t)
    assert again.recomputed == 6_000


def test_write_back_copies_only_what_leaves_the_gpu_and_the_scheduler_waits_for_it():
    """``--hicache-write-policy write_back``: nothing is copied when p's KV is cached; when q
    needs the room, the evicted tail of p's KV (and only it) is copied to host memory first and
    the worker stalls for the copy (no step runs until it is done); p's next prompt loads it
    back instead of recomputing."""
    w = WorkerModel("w", PROFILE, gpu_tokens=12_000, host_tokens=12_000, offload=True, write_back=True)
    finish(w, req("p", 9_000))
    assert w.host_used == 0 and w.stats.transfer_bytes == 0
    t0 = w.t
    q = finish(w, req("q", 5_000, output=1), t=t0)
    seg = w.segments["p"]
    evicted = 9_010 - seg.gpu
    assert evicted == 5_001 - (12_000 - 9_010)
    assert (seg.host_from, seg.host, w.host_used) == (seg.gpu, 9_010, evicted)
    assert w.stalled_until == pytest.approx(t0 + PROFILE.load_s(evicted))
    assert q.first_token_at is not None and q.first_token_at >= w.stalled_until
    gpu_part = seg.gpu
    again = finish(w, req("p", 9_010, output=1), t=w.t)
    assert again.recomputed == 0 and again.host_hit_tokens == 9_010 - gpu_part


def test_write_back_keeps_more_than_the_gpu_on_a_host_pool_the_size_of_the_gpu():
    """Three programs of 5,010 tokens on a 12,000-token GPU with a 12,000-token host pool:
    write-through mirrors the GPU on the host, so the one pushed off the GPU has no copy left
    and recomputes; write-back copies it when it leaves, so it loads back."""

    def third_visit(write_back: bool) -> Request:
        w = WorkerModel("w", PROFILE, gpu_tokens=12_000, host_tokens=12_000, offload=True, write_back=write_back)
        for pid in ("a", "b"):
            finish(w, req(pid, 5_000), t=w.t)
        finish(w, req("c", 5_000), t=w.t)  # pushes a off the GPU
        return finish(w, req("a", 5_010, output=1), t=w.t)

    assert third_visit(False).recomputed > 0
    assert third_visit(True).recomputed == 0


def test_write_back_never_drops_the_host_copy_a_promotion_is_loading():
    """p's 5,000 tokens are in host memory (a 5,000-token pool) and promoted; the room they
    need pushes q off the GPU, and q's write-back needs host room too. It must not take p's
    copy, which is being loaded: q's blocks are lost instead, and p's next request hits what
    was loaded."""
    w = WorkerModel("w", PROFILE, gpu_tokens=10_000, host_tokens=5_000, offload=True, write_back=True)
    for pid in ("p", "q", "r"):
        finish(w, req(pid, 4_990), t=w.t)
    assert (w.segments["p"].gpu, w.segments["p"].host) == (0, 5_000)
    assert w.promote("p", w.t)
    assert w.segments["p"].host == 5_000 and w.segments["q"].host == 0
    again = finish(w, req("p", 5_000, output=1), t=w.t)
    assert again.hit_tokens == 5_000 and again.recomputed == 0


def test_stock_host_eviction_never_takes_the_copy_of_a_gpu_resident_block():
    w = WorkerModel("w", PROFILE, gpu_tokens=100_000, host_tokens=10_000, offload=True)
    finish(w, req("q", 6_000))
    finish(w, req("p", 6_000), t=w.t)
    assert w.segments["q"].host == 6_010 and w.segments["q"].gpu == 6_010  # q's copy stays
    assert w.segments["p"].host == 10_000 - 6_010


def test_moris_patch_drops_host_copies_of_gpu_tier_programs_first():
    w = WorkerModel(
        "w", PROFILE, gpu_tokens=100_000, host_tokens=10_000, offload=True, typed_eviction=True, host_evicts_gpu_copies=True
    )
    finish(w, req("q", 6_000))
    w.relabel({}, {"q": 1, "p": 2})  # q in the GPU tier, p in the host tier
    finish(w, req("p", 6_000), t=w.t)
    assert w.segments["p"].host == 6_010 and w.segments["q"].host == 10_000 - 6_010


# -- engine: priorities --------------------------------------------------------------------------


def test_priority_ratchet_keeps_the_highest_priority_a_request_gave():
    w = WorkerModel("w", PROFILE, gpu_tokens=100_000, host_tokens=0, typed_eviction=True)
    finish(w, req("p", 1_000, priority=200))
    finish(w, req("p", 1_010, priority=-50), t=w.t)
    assert w.priorities["p"] == 200
    w.drop("p")  # fully evicted: recomputed KV starts from the next request's priority
    finish(w, req("p", 1_020, priority=-50), t=w.t)
    assert w.priorities["p"] == -50


def test_relabel_can_lower_a_label():
    w = WorkerModel("w", PROFILE, gpu_tokens=100_000, host_tokens=0, typed_eviction=True)
    finish(w, req("p", 1_000, priority=200))
    w.relabel({"p": -100}, {})
    assert w.priorities["p"] == -100


def test_typed_eviction_takes_the_lowest_priority_first_then_the_least_recent():
    w = WorkerModel("w", PROFILE, gpu_tokens=10_000, host_tokens=0, typed_eviction=True)
    for pid, prio in (("old_high", 100), ("old_low", 0), ("new_low", 0)):
        finish(w, req(pid, 2_000, output=0, priority=prio), t=w.t)
    finish(w, req("x", 5_000, output=0), t=w.t)  # needs 1,000 more: new_low/old_low, older first
    assert w.segments["old_low"].gpu < 2_000 and w.segments["new_low"].gpu == 2_000 and w.segments["old_high"].gpu == 2_000


# -- engine: review fixes ------------------------------------------------------------------------


def test_remove_during_a_warmup_frees_everything_and_later_steps_do_not_fail():
    w = WorkerModel("w", PROFILE, gpu_tokens=100_000, host_tokens=0)
    assert w.warm("p", "a", 20_000, 0, 0.0)
    w.remove("p")
    assert w.gpu_used == sum(p.tokens for p in w.prefixes.values() if p.resident) and "p" not in w.segments
    w.advance(10.0)
    assert not w.running


def test_promote_loads_from_a_host_copy_its_own_eviction_leaves_alone():
    """Promoting p needs GPU room, evicting q; q's eviction writes nothing, so p's host copy
    is intact and the whole of it is loaded."""
    w = WorkerModel("w", PROFILE, gpu_tokens=10_000, host_tokens=20_000, offload=True)
    finish(w, req("p", 4_990))
    finish(w, req("q", 8_000, output=0), t=w.t)  # evicts p from the GPU, its copy stays on host
    p = w.segments["p"]
    assert p.gpu < p.host == 5_000
    assert w.promote("p", w.t)
    assert p.gpu == p.host == 5_000


# -- ThunderAgent --------------------------------------------------------------------------------


def test_thunderagent_capacity_has_a_100_token_buffer_per_program_and_credits_shared_tokens():
    a = program("a", tokens=3_000, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
    b = program("b", tokens=2_000, home="w0", tier=Tier.GPU)
    st_ = state([("w0", 10_000, 0)], [a, b])
    st_.workers["w0"].used_tokens = 1_000  # the engine holds 1,000 of a's 3,000: 2,000 shared
    assert remaining_capacity(st_.view(NOW), "w0", [a, b]) == 10_000 - (3_000 + 2_000 - 2_000 + 2 * BUFFER_PER_PROGRAM)


def test_thunderagent_pauses_the_smallest_acting_then_marks_every_reasoning_program():
    small = program("small", tokens=1_000, home="w0", tier=Tier.GPU)
    big = program("big", tokens=2_000, home="w0", tier=Tier.GPU)
    r1 = program("r1", tokens=4_000, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
    r2 = program("r2", tokens=5_000, phase=Phase.REASONING, home="w0", tier=Tier.GPU)
    st_ = state([("w0", 8_000, 0)], [small, big, r1, r2])
    st_.workers["w0"].used_tokens = 9_000
    policy = ThunderAgent()
    decision = Scheduler(st_, policy).tick(NOW)
    assert [(m.program_id, m.dst) for m in decision.tier_moves if not m.lazy] == [("small", Tier.WAITING), ("big", Tier.WAITING)]
    # marking frees nothing: both are marked, and the marks live in the state, not in the policy
    assert {m.program_id for m in decision.tier_moves if m.lazy} == {"r1", "r2"} == decision.withheld
    assert st_.programs["r1"].lazy_demote and st_.programs["r2"].lazy_demote and vars(policy) == {}
    assert st_.programs["r1"].tier is Tier.GPU and not {"r1", "r2"} & decision.admitted
    st_.programs["r1"].phase, st_.programs["r1"].phase_since = Phase.ACTING, NOW + 1  # its request ended
    st_.touch("r1")
    decision = Scheduler(st_, ThunderAgent()).tick(NOW + 5)  # a fresh policy object: nothing lives in it
    assert ("r1", Tier.WAITING) in [(m.program_id, m.dst) for m in decision.tier_moves if not m.lazy]
    assert "r1" not in decision.withheld and "r2" in decision.withheld


def test_thunderagent_resumes_pending_then_new_then_acting_smallest_first_placed_largest_first():
    """14,000 free on w0, 6,000 on w1. Pool: pending p1 (3,000) and p2 (9,000), new n (2,000),
    acting a (1,000). Taken while the total (+100 each) fits 20,000: p1, p2, n (14,300); a would
    make 15,400, which fits too. Placed largest first on the most room: p2 → w0 (4,900 left),
    p1 → w1 (2,900), n → w0 (2,800), a → w1."""
    p1 = program("p1", tokens=3_000, phase=Phase.REASONING, home="w1", tier=Tier.WAITING)
    p2 = program("p2", tokens=9_000, phase=Phase.REASONING, home="w0", tier=Tier.WAITING)
    n = program("n", tokens=2_000, phase=Phase.REASONING)
    a = program("a", tokens=1_000, home="w0", tier=Tier.WAITING)
    st_ = state([("w0", 14_000, 0), ("w1", 6_000, 0)], [p1, p2, n, a])
    decision = Scheduler(st_, "thunderagent").tick(NOW)
    assert [(x.program_id, x.worker) for x in decision.assignments] == [("p2", "w0"), ("p1", "w1"), ("n", "w0"), ("a", "w1")]


def test_thunderagent_resume_skips_what_does_not_fit_the_total_and_places_by_room():
    big = program("big", tokens=9_000, phase=Phase.REASONING, home="w0", tier=Tier.WAITING)
    small = program("small", tokens=500, phase=Phase.REASONING, home="w0", tier=Tier.WAITING)
    st_ = state([("w0", 5_000, 0)], [big, small])
    decision = Scheduler(st_, "thunderagent").tick(NOW)
    assert [x.program_id for x in decision.assignments] == ["small"]


def test_thunderagent_new_programs_queue_behind_paused_ones():
    new = program("new", tokens=1_000, phase=Phase.REASONING)
    st_ = state(
        [("w0", 100_000, 0), ("w1", 100_000, 0)],
        [new, program("busy", tokens=5_000, phase=Phase.REASONING, home="w0", tier=Tier.GPU)],
    )
    decision = ThunderAgent().admit_at_arrival(st_.view(NOW), "new")
    assert decision is not None and [(a.program_id, a.worker) for a in decision.assignments] == [("new", "w1")]
    st_.programs["paused"] = program("paused", tokens=1_000, home="w0", tier=Tier.WAITING)
    assert ThunderAgent().admit_at_arrival(st_.view(NOW), "new") is None


# -- MORI ----------------------------------------------------------------------------------------


def test_mori_displaces_the_most_idle_gpu_programs_for_a_busy_one():
    """w0's GPU tier is full: idle (ι high) and warm (ι low) hold 4,000 each of 8,000. back has
    returned from its tool (wants the GPU now, ι lowest) and needs 3,512: MORI squeezes out the
    most idle (idle), not warm; without displacement nothing moves."""
    idle = program("idle", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(1, 99)] * 3)
    warm = program("warm", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(6, 4)] * 3)
    back = program("back", tokens=3_000, home="w0", tier=Tier.CPU, returned=True, cycles=[(9, 1)] * 3)
    for p in (idle, warm, back):
        p.phase_since = NOW
    st_ = state([("w0", 8_000, 20_000)], [idle, warm, back])
    decision = Scheduler(st_, "mori").tick(NOW)
    assert [(m.program_id, m.dst) for m in decision.tier_moves] == [("idle", Tier.CPU), ("back", Tier.GPU)]
    plan = plan_tiers(st_.view(NOW), promote_waiting=True)
    assert plan.moves == []  # back is on the GPU now; the first state, undisplaced, is checked below
    st2 = state(
        [("w0", 8_000, 20_000)],
        [
            program("idle", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(1, 99)] * 3),
            program("warm", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(6, 4)] * 3),
            program("back", tokens=3_000, home="w0", tier=Tier.CPU, returned=True),
        ],
    )
    assert plan_tiers(st2.view(NOW), promote_waiting=True).moves == []


def test_mori_never_displaces_a_less_idle_program_nor_in_vain():
    busy = program("busy", tokens=3_488, home="w0", tier=Tier.GPU, cycles=[(9, 1)] * 3)
    back = program("back", tokens=3_000, home="w0", tier=Tier.CPU, returned=True, cycles=[(1, 99)] * 3)
    busy.phase_since = back.phase_since = NOW
    st_ = state([("w0", 6_000, 20_000)], [busy, back])
    assert plan_tiers(st_.view(NOW), promote_waiting=True, displace=True).moves == []


def test_a_lazy_demotion_from_an_earlier_step_still_counts_as_leaving():
    """a was marked for lazy demotion last step and is still mid-step: the GPU tier is over by
    a's weight only, so the next step marks no one else."""
    a = program("a", tokens=5_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(1, 9)] * 3)
    b = program("b", tokens=5_488, phase=Phase.REASONING, home="w0", tier=Tier.GPU, cycles=[(5, 5)] * 3)
    st_ = state([("w0", 10_000, 20_000)], [a, b])
    sched = Scheduler(st_, "mori")
    assert [(m.program_id, m.lazy) for m in sched.tick(NOW).tier_moves] == [("a", True)]
    assert sched.tick(NOW + 1).tier_moves == ()


# -- replay cadence and bounds ----------------------------------------------------------------


def test_each_policy_runs_at_its_published_cadence_and_hold_bound():
    assert (RunConfig("thunderagent", 1).period, RunConfig("thunderagent", 1).hold) == (5.0, 1800.0)
    assert (RunConfig("thunderagent_offload", 1).period, RunConfig("mori", 1).period) == (5.0, 5.0)
    assert RunConfig("mori", 1, hold_timeout_s=30.0).hold == 30.0
    urgent = {name for name in SIM_POLICIES if RunConfig(name, 1).cadence.urgent_s is not None}
    # maitred (and its variants and the references run on it); the others wait for their period
    assert urgent == {"maitred", "maitred_no_preprefill", "maitred_write_through", "oracle", "belady"}
    assert RunConfig("maitred", 1).hold == 1800.0  # the gateway's default, the same in the replay
    with pytest.raises(ValueError, match="hold_timeout_s"):
        RunConfig("mori", 1, hold_timeout_s=-1)


def test_belady_keeps_the_program_needed_soonest_per_token_on_the_gpu():
    """Both acting, 4,000 tokens each in an 8,000-token GPU tier that holds one: soon (back in
    1 s) stays, late (back in 100 s) goes to host memory."""
    from maitred.runtime.policies.belady import Belady

    soon = program("soon", tokens=3_488, home="w0", tier=Tier.GPU)
    late = program("late", tokens=3_488, home="w0", tier=Tier.GPU)
    st_ = state([("w0", 6_000, 20_000)], [soon, late])
    policy = Belady()
    policy.next_use.update(soon=NOW + 1, late=NOW + 100)
    decision = Scheduler(st_, policy).tick(NOW)
    assert [(m.program_id, m.dst) for m in decision.tier_moves] == [("late", Tier.CPU)]
    assert decision.priorities["soon"] > decision.priorities["late"]


def test_a_host_tier_program_predicted_back_is_promoted_ahead_of_its_request():
    """t is still in its tool but its ETA says it returns within the period (r = 1), and the GPU
    has room: it comes up now, before it asks; u (no prediction of a return) stays."""
    t = program("t", tokens=2_488, home="w0", tier=Tier.CPU, cycles=[(9, 1)])
    t.tool.eta_s, t.tool.eta_at = 0.2, NOW
    u = program("u", tokens=2_488, home="w0", tier=Tier.CPU, cycles=[(9, 1)], tool_started=NOW)
    t.phase_since = u.phase_since = NOW
    st_ = state([("w0", 20_000, 20_000)], [t, u])
    view = st_.view(NOW)
    assert view.signals["t"].readiness.r == 1 and view.signals["u"].readiness.r == 0
    assert [(m.program_id, m.dst) for m in plan_tiers(view, promote_waiting=True).moves] == [("t", Tier.GPU)]


def test_readiness_history_per_signature_or_per_tool_is_a_replay_knob():
    from maitred.sim.replay import Replay
    from maitred.sim.traces.synthetic import SyntheticSpec, generate

    trace = generate(SyntheticSpec(programs=5, min_steps=2, max_steps=3))
    assert Replay(trace, RunConfig("maitred", 2, gpu_tokens=200_000)).state.use_signature
    assert not Replay(trace, RunConfig("maitred", 2, gpu_tokens=200_000, use_signature=False)).state.use_signature
