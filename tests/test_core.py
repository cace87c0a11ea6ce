"""The rules ``RuntimeCore`` owns, each exercised through the gateway and the replay alike."""

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest

from maitred.events import LLMEnd, ToolStart
from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.loop import Admission, LiveConfig, LiveDriver
from maitred.gateway.sglang.client import SGLangClient
from maitred.harness.background import BackgroundServer, free_port
from maitred.runtime.admission import EPOCH_SPAN, HOLD_TIMEOUT_S, encode_priority
from maitred.runtime.core import RuntimeCore
from maitred.runtime.decisions import Warmup
from maitred.runtime.policies import POLICIES, make_policy
from maitred.runtime.records import Phase, Tier
from maitred.runtime.state import _Programs
from maitred.sim.replay import Replay, RunConfig
from maitred.sim.traces import ProgramTrace, Step, ToolCall, Trace
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.server import SimWorkerThread
from tests.runtime_helpers import NOW, program, state


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Walked(AssertionError):
    pass


class _NoWalk(_Programs):
    """The program table, refusing to be walked: what the arrival path may not do."""

    def __iter__(self) -> Iterator[str]:
        raise _Walked("the program table was walked")

    def values(self) -> Any:
        raise _Walked("the program table was walked")

    def items(self) -> Any:
        raise _Walked("the program table was walked")

    def keys(self) -> Any:
        raise _Walked("the program table was walked")


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_new_programs_first_request_walks_no_program(policy):
    """Admission at arrival reads the arriving program and per-worker totals only, whatever the
    policy and however many programs are known (10,000 here): the gateway's event loop pays
    O(workers) per request, not O(programs)."""
    known = [program(f"k{i}", tokens=2_000, home=f"w{i % 8}", tier=Tier.GPU if i % 3 else Tier.CPU) for i in range(10_000)]
    st = state([(f"w{i}", 4_000_000, 4_000_000) for i in range(8)], known)
    core = RuntimeCore(st, policy)
    core.step(NOW)  # sizes maitred's tiers and settles the baselines' pools, as a running gateway has
    st.totals()
    st.programs.__class__ = _NoWalk
    try:
        arrival = core.arrive("newcomer", NOW + 1, prompt_tokens=1_000)
        again = core.arrive("k1", NOW + 1, prompt_tokens=2_000)
    finally:
        st.programs.__class__ = _Programs
    assert again.worker == st.programs["k1"].home_worker  # a GPU-tier program goes at once
    assert arrival.worker is None or arrival.worker.startswith("w")


def test_the_totals_follow_every_change_the_state_makes():
    """The incremental totals equal a fresh count after events, decisions and a worker failure."""
    from maitred.runtime.totals import Totals, WorkerTotals, share_of

    def totals_of(programs, reserve: int) -> Totals:  # the straightforward count, afresh
        out = Totals()
        for p in programs.values():
            out.add(share_of(p, reserve), +1)
        return out

    st = state(
        [("w0", 50_000, 0), ("w1", 50_000, 0)],
        [program(f"p{i}", tokens=1_000 * i, home=f"w{i % 2}", tier=Tier.GPU) for i in range(1, 9)],
    )
    core = RuntimeCore(st, "maitred")
    core.arrive("n1", NOW, prompt_tokens=3_000)
    core.step(NOW + 1)
    st.apply(ToolStart(ts=NOW + 2, program_id="p2", call_id="c", tool="bash"))
    st.set_worker_health("w1", False)
    core.end("p4", NOW + 3)
    fresh = totals_of(st.programs, st.cfg.reserve_tokens)
    live = st.totals()

    def nonzero(workers: dict[str, WorkerTotals]) -> dict[str, WorkerTotals]:
        return {w: t for w, t in workers.items() if t != WorkerTotals()}

    assert nonzero(live.workers) == nonzero(fresh.workers) and live.wanting_off_gpu == fresh.wanting_off_gpu
    assert live.homeless_wanting == fresh.homeless_wanting
    assert +live.agent_homes == +fresh.agent_homes


def test_policies_keep_no_memory_between_steps():
    """A fresh policy object each step decides as one kept for the whole run: what a policy
    remembers (round robin's cursor, ThunderAgent's marks) lives in the state."""
    for name in POLICIES:

        def run(fresh: bool, name: str = name) -> list[Any]:
            st = state(
                [("w0", 9_000, 9_000), ("w1", 9_000, 9_000)],
                [program(f"p{i}", tokens=2_500, phase=Phase.REASONING) for i in range(6)],
            )
            policy = make_policy(name)
            out = []
            for k in range(4):
                core = RuntimeCore(st, make_policy(name) if fresh else policy)
                result = core.step(NOW + k)
                out.append((result.decision.tier_moves, result.decision.assignments, result.decision.withheld))
                for pid in list(st.programs)[k::3]:
                    st.apply(ToolStart(ts=NOW + k + 0.5, program_id=pid, call_id=f"c{k}", tool="bash"))
            return out

        assert run(fresh=True) == run(fresh=False), name
        assert vars(make_policy(name)) in ({}, {"preprefill": True}) or name == "cache_aware", name


def _trace() -> Trace:
    steps = tuple(Step("coder", 2_000 + 500 * k, 40, tools=(ToolCall("Bash", 30.0),)) for k in range(4))
    return Trace("t", [ProgramTrace(f"p{i}", steps) for i in range(3)], {"coder": 300})


def test_the_hold_bound_and_cadence_are_the_policys_in_both_drivers():
    """One hold bound and one cadence per policy, read by the gateway and the replay alike."""
    for name in POLICIES:
        live = LiveConfig(policy=name)
        cadence = make_policy(name).cadence
        assert RunConfig(name, 1).cadence == cadence
        runtime = LiveDriver({}, live)
        assert runtime.core.cadence == cadence and runtime.state.cfg.period_s == cadence.period_s
    assert make_policy("maitred").cadence.hold_s == HOLD_TIMEOUT_S == 1800.0
    assert make_policy("thunderagent").cadence.hold_s == 1800.0 and make_policy("thunderagent").cadence.period_s == 5.0


def test_a_held_request_is_forced_to_its_home_else_the_least_loaded_worker():
    st = state(
        [("w0", 4_000, 0), ("w1", 4_000, 0)],
        [program("a", tokens=3_000, home="w0", tier=Tier.GPU), program("big", tokens=5_000, phase=Phase.REASONING)],
    )
    core = RuntimeCore(st, "maitred")
    assert core.arrive("big", NOW, prompt_tokens=5_000).worker is None and "big" in core.held
    assert core.hold_deadline("big") == NOW + HOLD_TIMEOUT_S
    assert core.force("big", NOW + HOLD_TIMEOUT_S) == "w1"  # no home: the least loaded (w0 holds a)
    assert "big" not in core.held and st.programs["big"].tier is Tier.GPU and st.programs["big"].home_worker == "w1"


def test_a_program_dropped_because_it_moved_frees_its_room_and_late_news_does_not_bring_it_back():
    """``drop`` forgets a program that goes on elsewhere as its end would (room, held requests,
    prompts, priorities), but says whether it was live: a shard counts what it really dropped."""
    st = state([("w0", 4_000, 0), ("w1", 4_000, 0)], [program("moved", tokens=3_000, home="w0", tier=Tier.GPU)])
    core = RuntimeCore(st, "maitred")
    core.prompt_seen("moved")
    core.priority_for("moved", "w0", NOW)
    core.held["moved"] = NOW
    assert st.gpu_used()["w0"] >= 3_000
    assert core.drop("moved", NOW + 1) is True
    assert "moved" not in st.programs and "moved" not in core.held and "moved" not in core.ratchet
    assert "moved" not in core.prompts.last and st.gpu_used()["w0"] == 0
    core.observe(LLMEnd(ts=NOW, program_id="moved", request_id="r1", prompt_tokens=3_000, completion_tokens=10, worker="w0"))
    assert "moved" not in st.programs, "an answer stamped before the drop is late news"
    assert core.drop("moved", NOW + 2) is False and core.drop("never-here", NOW + 2) is False
    assert core.arrive("moved", NOW + 3, prompt_tokens=100).event.program_id == "moved" and "moved" in st.programs


def test_priorities_rise_by_epoch_under_the_ratchet_in_both_drivers():
    """SGLang keeps the highest priority a prefix was given, so priorities rise with time: the
    policy's within each 10 s epoch, every epoch above the last. The replay sends what the
    gateway sends (its engine keeps the ratchet)."""
    assert encode_priority(150, 25.0, 0.0, 10.0) == 2 * EPOCH_SPAN + 150
    assert encode_priority(-100, 31.0, 0.0, 10.0) > encode_priority(200, 29.0, 0.0, 10.0)
    replay = Replay(_trace(), RunConfig("maitred", 3, duration_s=200.0, stagger_s=0.0))
    replay.run()
    sent = [v for by_worker in replay.core.ratchet.values() for v in by_worker.values()]
    assert sent and max(sent) // EPOCH_SPAN >= 9  # programs still running past 90 s of virtual time
    t = [1000.0]
    runtime = LiveDriver({}, LiveConfig(priority=True), clock=lambda: t[0])
    first = runtime.priority_for("p", "w")
    t[0] += 25.0
    assert runtime.priority_for("p", "w") == first + 2 * EPOCH_SPAN
    assert runtime.ratchet["p"]["w"] == first + 2 * EPOCH_SPAN


@pytest.mark.anyio
async def test_a_chat_programs_warmup_is_rendered_by_the_workers_tokenizer():
    """Chat traffic is warmable live: the gateway keeps a chat request's messages and, when the
    core sends a warmup for the program, has the worker render them (``/v1/tokenize``) and
    prefills the ids, so the program's next request finds them cached."""
    messages = [{"role": "system", "content": "you are the coder " * 200}, {"role": "user", "content": "fix it"}]
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=200_000, time_scale=20.0)) as sim:
        async with httpx.AsyncClient() as client, aiohttp.ClientSession() as session:
            runtime = LiveDriver({sim.url: SGLangClient(sim.url, lambda: session)}, LiveConfig(tick_s=0.2, poll_s=0.2))
            await runtime.start()
            try:
                runtime.state.apply(ToolStart(ts=runtime.clock(), program_id="c1", call_id="x", tool="bash"))
                runtime.remember_prompt("c1", (messages, None))
                runtime._start_warmup(Warmup("c1", sim.url, 400, "recompute", 1.0))
                await runtime._warming["c1"]
                assert 'maitred_warmups_total{outcome="done"} 1.0' in runtime.metrics.render().decode()
            finally:
                await runtime.stop()
            r = await client.post(
                sim.url + "/v1/chat/completions", timeout=30, json={"model": "sim", "max_tokens": 4, "messages": messages}
            )
    usage = r.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0.8 * usage["prompt_tokens"], usage


def test_a_request_refused_for_want_of_workers_leaves_no_program_behind():
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = build_app(ServeConfig([dead], runtime=LiveConfig(tick_s=0.2, poll_s=0.2)))
    with BackgroundServer(gateway.app) as server:
        for body in (
            {"model": "sim", "program_id": "named", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            {"model": "sim", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
        ):
            r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
            assert r.status_code == 503 and "no worker" in r.json()["error"]["message"]
        assert httpx.get(server.url + "/v1/programs", timeout=10).json() == []


async def _held_request(runtime: LiveDriver) -> "asyncio.Task[Admission]":
    """A request of the 50,000-token program "big", once the gateway holds it."""
    waiting = asyncio.create_task(runtime.admit("big", request_id="r1", agent=None, model=None, prompt_tokens=50_000))
    while "big" not in runtime.core.held:
        await asyncio.sleep(0.01)
    return waiting


async def _held_driver(sim: SimWorkerThread, session: aiohttp.ClientSession) -> LiveDriver:
    runtime = LiveDriver({sim.url: SGLangClient(sim.url, lambda: session)}, LiveConfig(tick_s=0.2, poll_s=0.2))
    await runtime.start(wait_for_workers_s=10)
    return runtime


@pytest.mark.anyio
async def test_a_held_request_whose_client_leaves_stops_wanting_the_gpu():
    """A client that gives up on a held request (a timeout, a closed connection) leaves no program
    wanting the GPU behind: its step ends cancelled, it blocks no newcomer's admission at
    arrival and is not placed for a request that is gone."""
    import asyncio

    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=20_000, time_scale=20.0)) as sim:
        async with aiohttp.ClientSession() as session:
            runtime = await _held_driver(sim, session)
            try:
                waiting = await _held_request(runtime)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
                assert runtime.state.programs["big"].phase is Phase.ACTING and "big" not in runtime.core.held
                small = await runtime.admit("small", request_id="r2", agent=None, model=None, prompt_tokens=100)
                assert small.worker == sim.url and small.waited_s == 0.0
            finally:
                await runtime.stop()


@pytest.mark.anyio
async def test_a_program_that_ends_while_held_has_its_request_let_through():
    """A late ``program.end`` racing the program's next request: no step can admit a program the
    state no longer has, so the held request goes at once instead of waiting out the hold bound."""
    import asyncio

    from maitred.events import ProgramEnd

    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=20_000, time_scale=20.0)) as sim:
        async with aiohttp.ClientSession() as session:
            runtime = await _held_driver(sim, session)
            try:
                waiting = await _held_request(runtime)
                runtime.ingest([ProgramEnd(ts=runtime.clock(), program_id="big")])
                admission = await asyncio.wait_for(waiting, 10)
                assert admission.worker == sim.url and admission.waited_s < 10 and runtime.core.forced == 1
            finally:
                await runtime.stop()


@pytest.mark.anyio
async def test_a_program_moved_away_while_held_has_its_request_let_through_and_is_counted():
    """Another shard claimed a program one of whose requests is held here (the balancer moved it
    mid-wait): as after a late ``program.end``, the request goes now instead of waiting out
    the hold bound; only a program that was live here counts as moved away."""
    import asyncio

    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=20_000, time_scale=20.0)) as sim:
        async with aiohttp.ClientSession() as session:
            runtime = await _held_driver(sim, session)
            try:
                waiting = await _held_request(runtime)
                runtime.moved_away("big")
                admission = await asyncio.wait_for(waiting, 10)
                assert admission.worker == sim.url and runtime.core.forced == 1
                runtime.moved_away("never-here")
                assert runtime.metrics.moved_away._value.get() == 1
            finally:
                await runtime.stop()


def test_programs_silent_past_their_ttl_are_dropped_without_counting_as_moved():
    t = [1000.0]
    runtime = LiveDriver({}, LiveConfig(program_ttl_s=60.0), clock=lambda: t[0])
    runtime.ingest([ToolStart(ts=t[0], program_id="quiet", call_id="c", tool="bash")])
    assert "quiet" in runtime.state.programs
    t[0] += 61.0
    runtime._forget_silent(t[0])
    assert "quiet" not in runtime.state.programs and runtime.metrics.moved_away._value.get() == 0


def test_a_warmup_that_cannot_be_sent_takes_no_slot_of_one_that_can():
    """Warmup admission reads which prompts the driver holds: two handoffs whose consumers' prompts
    were never announced do not fill the worker's warmup slots ahead of a program about to
    return whose last prompt the driver holds."""
    from maitred.events import Handoff, LLMEnd, ToolEnd

    st = state([("w0", 200_000, 200_000)], [])
    core = RuntimeCore(st, "maitred")
    t = NOW
    for pid in ("h1", "h2", "r"):
        core.arrive(pid, t, agent="planner", prompt_tokens=3_000)
        core.step(t)
        core.observe(LLMEnd(ts=t + 1, program_id=pid, request_id="x", prompt_tokens=3_000, completion_tokens=10, worker="w0"))
    core.prompt_seen("r")
    for pid in ("h1", "h2"):  # handoffs without expected_prompt: the gateway has no consumer prompt to send
        core.observe(Handoff(ts=t + 2, program_id=pid, from_agent="planner", to_agent="coder", context_tokens=2_000))
    core.observe(ToolStart(ts=t + 2, program_id="r", call_id="c", tool="bash"))
    st.programs["r"].tier = Tier.CPU  # its KV went to host memory while it waited
    st.touch("r")
    core.observe(ToolEnd(ts=t + 3, program_id="r", call_id="c"))
    result = core.step(t + 3.1)
    admitted = [(w.program_id, w.kind) for w in result.decision.warmups]
    assert not [w for w in admitted if w[0].startswith("h")], admitted  # the policy never admits them
    assert result.warmups == result.decision.warmups


def test_a_held_request_whose_client_disconnects_is_dropped_not_sent_later():
    """Through the HTTP app: a client that gives up on a held request (its timeout) leaves
    nothing held and no program wanting the GPU, instead of the request going to a worker when
    its hold (1,800 s) ends."""
    import time

    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=20_000, time_scale=20.0)) as sim:
        gateway = build_app(ServeConfig([sim.url], runtime=LiveConfig(tick_s=0.2, poll_s=0.2), wait_for_workers_s=10))
        with BackgroundServer(gateway.app) as server:
            # estimated at 37,500 tokens, more than admission gives one program here, so it is held;
            # not so large that no worker could hold it (then it is refused at once)
            body = {"model": "sim", "program_id": "big", "max_tokens": 1, "prompt": "word " * 30_000}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
            deadline = time.monotonic() + 10
            while httpx.get(server.url + "/healthz", timeout=5).json()["requests_held"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert httpx.get(server.url + "/healthz", timeout=5).json()["requests_held"] == 0
            assert httpx.get(server.url + "/v1/programs/big", timeout=5).json()["phase"] == "acting"
            metrics = httpx.get(server.url + "/metrics", timeout=5).text
            assert 'maitred_requests_total{endpoint="completions",outcome="client_gone"} 1.0' in metrics
