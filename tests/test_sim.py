"""Simulator sanity checks that would catch a broken model, trace readers, synthetic calibration."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from maitred.sim.engine import Request, WorkerModel
from maitred.sim.profile import EngineProfile
from maitred.sim.replay import SIM_POLICIES, RunConfig, run_one
from maitred.sim.traces import ProgramTrace, ToolCall, Trace, TraceError, load_trace, read_tracelab
from maitred.sim.traces.synthetic import NOMINAL_STEP_S, SyntheticSpec, generate

SWE = Path(__file__).parent / "data" / "swe-agent-glm45-subset"  # 8 of the 64 sessions; see its README
PROFILE = EngineProfile()


@pytest.fixture(scope="module")
def small_trace() -> Trace:
    return generate(SyntheticSpec(programs=40, seed=3, min_steps=10, max_steps=30))


def run(trace, policy, concurrency=30, **kw):
    kw.setdefault("duration_s", 600)
    gpu = kw.pop("gpu_tokens", 300_000)
    unlimited = kw.pop("unlimited", False)
    return run_one(trace, RunConfig(policy, concurrency, gpu_tokens=gpu, **kw), PROFILE, unlimited=unlimited)


def test_with_unlimited_memory_every_policy_has_the_same_throughput(small_trace):
    results = {p: run(small_trace, p, unlimited=True).throughput_tok_s for p in SIM_POLICIES}
    best = max(results.values())
    assert all(v >= 0.99 * best for v in results.values()), results


def test_with_zero_tool_time_tiering_has_nothing_to_gain(small_trace):
    """No program is ever idle, so idleness ranks nothing and readiness predicts nothing: the
    tiers barely move and maitred's extra signals buy nothing over MORI's plain tiering. (Both
    still beat ThunderAgent+offload by ~6% here: their GPU-tier admission control limits
    thrashing, which ThunderAgent, pausing only acting programs, does not do without tools.)"""
    no_tools = Trace(
        "no-tools",
        [
            ProgramTrace(
                p.program_id, tuple(replace(s, tools=tuple(replace(t, duration_s=0.0) for t in s.tools)) for s in p.steps)
            )
            for p in small_trace.programs
        ],
        small_trace.prefix_tokens,
    )
    ours, mori = run(no_tools, "maitred"), run(no_tools, "mori")
    assert ours.throughput_tok_s == pytest.approx(mori.throughput_tok_s, rel=0.02)
    assert ours.tier_moves < 0.01 * ours.requests and mori.tier_moves < 0.01 * mori.requests


def test_oracle_is_never_much_worse_than_maitred(small_trace):
    """The oracle knows each tool's true duration, which is a better signal, not an optimal
    policy: promoting on exact readiness can fill the GPU a little earlier than it pays (within
    1% here at 40 programs). A broken readiness path would show as a larger gap."""
    for concurrency in (20, 40):
        oracle = run(small_trace, "oracle", concurrency).throughput_tok_s
        ours = run(small_trace, "maitred", concurrency).throughput_tok_s
        assert oracle >= ours * 0.98, (concurrency, oracle, ours)


@pytest.mark.parametrize("policy", ["thunderagent_offload", "mori", "maitred"])
def test_doubling_host_memory_never_lowers_an_offloading_policys_throughput(small_trace, policy):
    one = run(small_trace, policy, 40, cpu_ratio=1.0).throughput_tok_s
    two = run(small_trace, policy, 40, cpu_ratio=2.0).throughput_tok_s
    assert two >= one * 0.995, (one, two)


def test_results_are_identical_for_the_same_seed(small_trace):
    a = run(small_trace, "maitred", seed=7)
    b = run(small_trace, "maitred", seed=7)
    c = run(small_trace, "maitred", seed=8)
    assert a == b
    assert a != c


def test_memory_pressure_separates_policies_and_stays_below_the_physical_limit(small_trace):
    limit = run(small_trace, "round_robin", 40, unlimited=True).throughput_tok_s
    results = {p: run(small_trace, p, 40).throughput_tok_s for p in ("round_robin", "thunderagent_offload", "maitred")}
    assert all(v <= limit * 1.001 for v in results.values())
    assert max(results.values()) > 1.05 * min(results.values())


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_unlimited_memory_bounds_every_policy_on_random_workloads(seed):
    """``unlimited`` is the bound the reports read every cell against (``belady`` is not one):
    on randomly drawn workloads, memory and concurrency, no policy's throughput exceeds it."""
    rng = np.random.default_rng(seed)
    trace = generate(
        SyntheticSpec(
            programs=30,
            seed=seed,
            min_steps=5,
            max_steps=20,
            handoffs=float(rng.choice([0.0, 0.5])),
            tool_scale=float(rng.choice([0.5, 1.0, 4.0])),
        )
    )
    concurrency, gpu, ratio = int(rng.choice([10, 20, 40])), int(rng.choice([150_000, 300_000])), float(rng.choice([0, 1, 2]))
    limit = run(trace, "round_robin", concurrency, gpu_tokens=gpu, duration_s=300, seed=seed, unlimited=True)
    for policy in SIM_POLICIES:
        got = run(trace, policy, concurrency, gpu_tokens=gpu, cpu_ratio=ratio, duration_s=300, seed=seed)
        assert got.throughput_tok_s <= limit.throughput_tok_s * 1.001, (policy, got.throughput_tok_s, limit.throughput_tok_s)


def test_a_gpu_too_small_for_the_longest_step_is_a_clear_error(small_trace):
    with pytest.raises(ValueError, match="gpu_tokens: 1,000 per worker cannot hold the trace's longest step"):
        run(small_trace, "maitred", gpu_tokens=1_000)


def test_engine_hits_loads_and_recomputes_as_memory_allows():
    """12,000 GPU tokens. p caches 10,000 tokens; q then needs 9,100, evicting the last 7,100 of
    p's (the tail goes first, so 2,900 of p's prefix stay). When p returns with a 10,000-token
    prompt: with offloading the 7,100 come back from host memory (nothing recomputed); without,
    they are recomputed."""
    for offload, recompute in ((True, 0), (False, 7_100)):
        w = WorkerModel("w", PROFILE, gpu_tokens=12_000, host_tokens=50_000, offload=offload)
        w.submit(Request("p", "a", 9_900, 100, 0.0), 0.0)
        while w.running:
            w.advance(w.next_event_time())
        w.submit(Request("q", "a", 9_000, 100, w.t), w.t)
        while w.running:
            w.advance(w.next_event_time())
        again = Request("p", "a", 10_000, 100, w.t)
        w.submit(again, w.t)
        assert (again.recomputed, again.hit_tokens) == (recompute, 10_000 - recompute), offload
        assert (w.stats.transfer_bytes > 0) is offload


def test_step_time_model_matches_the_profile():
    w = WorkerModel("w", PROFILE, gpu_tokens=100_000, host_tokens=0)
    req = Request("p", "a", 4_000, 1, 0.0)
    w.submit(req, 0.0)
    done = w.advance(10.0)
    assert done == [req]
    assert req.first_token_at == pytest.approx(PROFILE.step_s(4_000, 0, 0))


def test_profile_round_trips_and_rejects_bad_files(tmp_path):
    path = tmp_path / "p.json"
    PROFILE.save(path)
    assert EngineProfile.load(path) == PROFILE
    data = json.loads(path.read_text())
    data["gpu_kv_tokens"] = "lots"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="gpu_kv_tokens must be an integer"):
        EngineProfile.load(path)
    path.write_text(json.dumps({"gpu_tokens": 5}))
    with pytest.raises(ValueError, match="unknown fields"):
        EngineProfile.load(path)


def test_synthetic_workload_matches_published_claude_code_statistics():
    """Targets from MORI's Claude Code study and how close the generator comes (seed 0, 400
    programs): p50 1.1 s, p90 2.0 s, p99 20 s within 10%; p99.95 84 s within 15% (74 s); 87% of
    calls under 2 s within 2 points; long calls' share of tool time 58% within 8 points (51%);
    busy phases at the nominal step: median 20 s within 10%, p90 81 s within 20% (69 s)."""
    trace = generate(SyntheticSpec(programs=400, seed=0))
    d = np.array(trace.tool_durations())
    p50, p90, p99, p9995 = np.percentile(d, [50, 90, 99, 99.95])
    assert p50 == pytest.approx(1.1, rel=0.10)
    assert p90 == pytest.approx(2.0, rel=0.10)
    assert p99 == pytest.approx(20.0, rel=0.10)
    assert p9995 == pytest.approx(84.0, rel=0.15)
    assert (d < 2).mean() == pytest.approx(0.87, abs=0.02)
    assert d[d >= 2].sum() / d.sum() == pytest.approx(0.58, abs=0.08)
    busy = []
    for p in trace.programs:
        current = 0.0
        for step in p.steps:
            current += NOMINAL_STEP_S
            for tool in step.tools:
                if tool.duration_s >= 2:
                    busy.append(current)
                    current = 0.0
                else:
                    current += tool.duration_s
        busy.append(current)
    assert np.median(busy) == pytest.approx(20.0, rel=0.10)
    assert np.percentile(busy, 90) == pytest.approx(81.0, rel=0.20)
    grows = [
        all(b.input_tokens > a.input_tokens for a, b in zip(p.steps, p.steps[1:]) if b.handoff_tokens is None)
        for p in trace.programs
    ]
    assert all(grows)


def test_synthetic_handoffs_and_options():
    trace = load_trace("synthetic:claude-code?programs=50&handoffs=1&human_waits=0.5&seed=2")
    assert len(trace.programs) == 50
    assert all(any(s.handoff_tokens for s in p.steps) for p in trace.programs)
    assert any(s.human_wait_s > 0 for p in trace.programs for s in p.steps)
    with pytest.raises(TraceError, match="option 'colour' is unknown"):
        load_trace("synthetic:claude-code?colour=red")
    with pytest.raises(TraceError, match="handoffs must be a share"):
        load_trace("synthetic:claude-code?handoffs=3")


def _swe_figures_by_hand(root: Path) -> tuple[list[float], list[int], list[int]]:
    """Tool durations, steps per session and final prompts, straight from the files: the
    reader's answer is checked against this, not against itself."""
    durations, steps, final = [], [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        entered = {}
        for line in (folder / "stage_timings.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r["stage"] == "tool_execution":
                key = (r["step"], r["attempt"])
                if r["phase"] == "enter":
                    entered[key] = r["timestamp"]
                else:
                    durations.append(r["timestamp"] - entered.pop(key))
        # a step recorded twice (a requery: django__django-15202 step 32) counts once, its last record
        metrics = {r["step"]: r for r in map(json.loads, (folder / "prefix_cache_metrics.jsonl").read_text().splitlines())}
        steps.append(len(metrics))
        final.append(metrics[max(metrics)]["input_tokens"])
    return durations, steps, final


def test_swe_agent_reader_matches_the_files_and_the_data_readme():
    trace = load_trace(SWE)
    durations, steps, final = _swe_figures_by_hand(SWE)
    assert len(trace.programs) == 8 and not trace.skipped
    assert sorted(trace.tool_durations()) == pytest.approx(sorted(durations))
    assert [len(p.steps) for p in trace.programs] == steps
    assert [p.steps[-1].input_tokens for p in trace.programs] == final
    # the figures tests/data/swe-agent-glm45-subset/README.md states
    d = np.array(trace.tool_durations())
    assert len(d) == 328
    assert np.percentile(d, 50) == pytest.approx(0.150, abs=0.001)
    assert np.median([len(p.steps) for p in trace.programs]) == 39.5
    assert np.median([p.steps[-1].input_tokens for p in trace.programs]) == 33_008


def test_tracelab_reader_keeps_good_rounds_and_names_bad_fields(tmp_path, caplog):
    path = tmp_path / "rounds.jsonl"
    rows = [
        {
            "session_id": "s1",
            "round": 0,
            "input_tokens_total": 1000,
            "newly_append_tokens": 1000,
            "output_tokens": 50,
            "tools": [{"name": "bash", "emitted_at": 10.0, "result_at": 12.5}],
        },
        {"session_id": "s1", "round": 1, "input_tokens_total": "many", "output_tokens": 50},
        {
            "session_id": "s1",
            "round": 2,
            "input_tokens_total": 1400,
            "newly_append_tokens": 350,
            "output_tokens": 40,
            "tools": [{"name": "grep", "emitted_at": 20.0, "result_at": 19.0}],
        },
        {"round": 0, "input_tokens_total": 5, "output_tokens": 5},
        {"trace_id": "s2", "input_tokens_total": 700, "output_tokens": 30, "tools": []},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    trace = read_tracelab(path)
    assert [p.program_id for p in trace.programs] == ["s1", "s2"]
    assert trace.programs[0].steps[0].tools == (ToolCall("bash", 2.5),)
    assert [(s.input_tokens, s.tools) for s in trace.programs[0].steps[1:]] == [(1400, ())]  # only the bad tool went
    reasons = "\n".join(trace.skipped)
    assert ":2: input_tokens_total: expected a finite whole number, got 'many'; round skipped" in reasons
    assert ":3: tools[0].result_at: before emitted_at; tool call skipped" in reasons
    assert ":4: session_id: missing" in reasons
    assert ":6: invalid JSON" in reasons
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"round": 1}) + "\n")
    with pytest.raises(TraceError, match="no usable program"):
        read_tracelab(empty)


def test_maitred_export_replays(tmp_path):
    from maitred.events import decode_batch
    from maitred.storage import SessionStore

    raw = [{"type": "program.start", "ts": 1e9, "program_id": "p", "agent": "planner"}]
    t = 1e9
    for i in range(4):
        raw += [
            {"type": "llm.start", "ts": t, "program_id": "p", "request_id": f"r{i}", "agent": "planner"},
            {
                "type": "llm.end",
                "ts": t + 1,
                "program_id": "p",
                "request_id": f"r{i}",
                "prompt_tokens": 1000 + 500 * i,
                "completion_tokens": 60,
            },
            {"type": "tool.start", "ts": t + 1, "program_id": "p", "call_id": f"c{i}", "tool": "Bash", "deadline_s": 30.0},
            {"type": "tool.end", "ts": t + 3, "program_id": "p", "call_id": f"c{i}"},
        ]
        t += 4
    with SessionStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.write(decode_batch(raw, now=2e9).events)
        store.export_trace(tmp_path / "t.jsonl")
    trace = load_trace(tmp_path / "t.jsonl")
    (program,) = trace.programs
    assert [s.input_tokens for s in program.steps] == [1000, 1500, 2000, 2500]
    assert program.steps[0].tools == (ToolCall("Bash", 2.0, 30.0, None),)
    assert run_one(trace, RunConfig("maitred", 2, duration_s=60), PROFILE).requests > 4


def test_bench_cli_writes_results_report_and_plots(tmp_path):
    from maitred.cli import main

    out = tmp_path / "bench"
    assert (
        main(
            [
                "bench",
                "replay",
                "--trace",
                "synthetic:claude-code?programs=20&max_steps=20",
                "--policy",
                "thunderagent,maitred",
                "--concurrency",
                "4,8",
                "--cpu-ratio",
                "1",
                "--duration",
                "120",
                "--gpu-tokens",
                "150000",
                "--jobs",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert {(r["policy"], r["concurrency"]) for r in runs} == {
        (p, c) for p in ("thunderagent", "maitred", "unlimited") for c in (4, 8)
    }
    for key in (
        "throughput_tok_s",
        "ttft_mean_s",
        "ttft_p95_s",
        "latency_mean_s",
        "latency_p95_s",
        "prefix_hit_rate",
        "recomputed_tokens",
        "transfer_bytes",
        "tier_moves",
        "cpu_ratio",
    ):
        assert key in runs[0]
    report = (out / "report.md").read_text()
    assert "| maitred |" in report
    assert "Command: `maitred bench replay --trace 'synthetic:claude-code?programs=20&max_steps=20'" in report
    assert report.split("`")[1].endswith(f"--out {out}")
    for png in ("throughput.png", "ttft.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_bench_cli_history_flag_reaches_the_runs(tmp_path):
    """``--history tool`` replays with per-tool readiness history (SPEC 7.2's comparison): the
    report says so, and the runs' prediction error differs from per-signature history on a
    trace whose tools have signatures of very different durations."""
    from maitred.cli import main

    errors = {}
    for history in ("signature", "tool"):
        out = tmp_path / history
        assert (
            main(
                [
                    "bench",
                    "replay",
                    "--trace",
                    "synthetic:claude-code?programs=20&max_steps=30",
                    "--policy",
                    "maitred",
                    "--concurrency",
                    "8",
                    "--cpu-ratio",
                    "1",
                    "--duration",
                    "600",
                    "--history",
                    history,
                    "--jobs",
                    "1",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        errors[history] = json.loads((out / "results.json").read_text())["runs"][-1]["prediction_mae_s"]
        assert ("per-tool history" in (out / "report.md").read_text()) == (history == "tool")
    assert errors["signature"] is not None and errors["tool"] is not None and errors["signature"] != errors["tool"]


def test_bench_cli_sizing_flags_reach_maitreds_signal_config(tmp_path, monkeypatch):
    """``--busy-margin`` / ``--overcommit-headroom`` (as maitred serve's) size maitred's tier in
    the replay; the report and results say which values ran."""
    from maitred.cli import main
    from maitred.sim import replay

    seen = []
    real = replay.Replay.__post_init__

    def spy(self):
        real(self)
        seen.append((self.state.cfg.busy_margin, self.state.cfg.overcommit_headroom))

    monkeypatch.setattr(replay.Replay, "__post_init__", spy)
    out = tmp_path / "sized"
    assert (
        main(
            [
                "bench",
                "replay",
                "--trace",
                "synthetic:claude-code?programs=10&max_steps=20",
                "--policy",
                "maitred",
                "--concurrency",
                "4",
                "--cpu-ratio",
                "1",
                "--duration",
                "60",
                "--busy-margin",
                "0.5",
                "--overcommit-headroom",
                "0",
                "--jobs",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert seen and set(seen) == {(0.5, 0.0)}
    assert "maitred's busy margin 0.5; maitred's overcommit headroom 0." in (out / "report.md").read_text()
    matrix = json.loads((out / "results.json").read_text())["matrix"]
    assert (matrix["busy_margin"], matrix["overcommit_headroom"]) == (0.5, 0.0)


def test_bench_cli_period_and_hold_flags_reach_every_policys_run(tmp_path, monkeypatch):
    """``--period`` / ``--hold-timeout`` replace each policy's own step period and hold bound
    (the cadence ablations in BENCHMARKS.md); the report and results say which values ran."""
    from maitred.cli import main
    from maitred.sim import replay

    seen = set()
    real = replay.Replay.__post_init__

    def spy(self):
        real(self)
        seen.add((self.cfg.policy, self.cfg.period, self.cfg.hold))

    monkeypatch.setattr(replay.Replay, "__post_init__", spy)
    out = tmp_path / "cadence"
    assert (
        main(
            [
                "bench",
                "replay",
                "--trace",
                "synthetic:claude-code?programs=10&max_steps=20",
                "--policy",
                "maitred,mori",
                "--concurrency",
                "4",
                "--cpu-ratio",
                "1",
                "--duration",
                "60",
                "--period",
                "2.5",
                "--hold-timeout",
                "60",
                "--jobs",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert {(policy, period, hold) for policy, period, hold in seen if policy != "round_robin"} == {
        ("maitred", 2.5, 60.0),
        ("mori", 2.5, 60.0),
    }
    assert "every policy's step period (s) 2.5; every policy's hold bound (s) 60." in (out / "report.md").read_text()
    matrix = json.loads((out / "results.json").read_text())["matrix"]
    assert (matrix["period_s"], matrix["hold_timeout_s"]) == (2.5, 60.0)


def test_bench_cli_rejects_bad_flags(capsys):
    from maitred.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "replay", "--trace", "synthetic", "--policy", "fifo", "--out", "x"])
    assert "--policy: unknown fifo" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "replay", "--trace", "synthetic", "--concurrency", "ten", "--out", "x"])
    assert "--concurrency" in capsys.readouterr().err
    assert main(["bench", "replay", "--trace", "/nonexistent/trace.jsonl", "--out", "x"]) == 1
    assert "/nonexistent/trace.jsonl: no such file" in capsys.readouterr().err


def test_calibrate_writes_a_cpu_profile(tmp_path):
    pytest.importorskip("torch")
    from maitred.cli import main

    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--out", str(out), "--device", "cpu"]) == 0
    profile = EngineProfile.load(out)
    assert profile.device == "cpu" and "CPU run" in profile.notes
    assert profile.prefill_s_per_token > 0 and profile.h2d_bytes_per_s > 0 and profile.kv_bytes_per_token > 0


def test_synthetic_tool_scale_and_subagents():
    """tool_scale multiplies time in tools and changes nothing else; subagents turn a share of
    idle phases into Agent-tool waits of 5–20 nominal steps; the defaults leave the trace as it was."""
    base = generate(SyntheticSpec(programs=30, seed=1))
    scaled = generate(SyntheticSpec(programs=30, seed=1, tool_scale=4))
    for p, q in zip(base.programs, scaled.programs):
        assert [s.input_tokens for s in p.steps] == [s.input_tokens for s in q.steps]
        assert [t.duration_s * 4 for s in p.steps for t in s.tools] == pytest.approx(
            [t.duration_s for s in q.steps for t in s.tools]
        )
    with_sub = generate(SyntheticSpec(programs=30, seed=1, subagents=0.5))
    waits = [t.duration_s for p in with_sub.programs for s in p.steps for t in s.tools if t.signature == "Task:subagent"]
    assert waits and all(5 * NOMINAL_STEP_S <= d <= 20 * (NOMINAL_STEP_S + 2.0) for d in waits)
    assert generate(SyntheticSpec(programs=30, seed=1, subagents=0.0)) == base
    with pytest.raises(ValueError, match="tool_scale"):
        SyntheticSpec(tool_scale=0)


def test_synthetic_context_scale_grows_each_programs_own_context_only():
    """context_scale multiplies a program's own context (its start and each step's growth) and
    leaves the agents' shared prompts, the outputs and the tools as they were."""
    base = generate(SyntheticSpec(programs=30, seed=1))
    long = generate(SyntheticSpec(programs=30, seed=1, context_scale=2))
    assert long.prefix_tokens == base.prefix_tokens
    for p, q in zip(base.programs, long.programs):
        assert [s.output_tokens for s in p.steps] == [s.output_tokens for s in q.steps]
        assert [s.tools for s in p.steps] == [s.tools for s in q.steps]
        prefix = base.prefix_tokens[p.steps[0].agent]
        own = [s.input_tokens - prefix for s in p.steps if s.agent == p.steps[0].agent]
        scaled = [s.input_tokens - prefix for s in q.steps if s.agent == q.steps[0].agent]
        outputs = [0, *(s.output_tokens for s in p.steps)]
        for k, (a, b) in enumerate(zip(own, scaled)):
            # each step adds int(2 × growth), not 2 × int(growth): at most one token more per step
            before = a - sum(outputs[: k + 1])
            assert 2 * before <= b - sum(outputs[: k + 1]) <= 2 * before + k
    assert generate(SyntheticSpec(programs=30, seed=1, context_scale=1.0)) == base
    with pytest.raises(ValueError, match="context_scale"):
        SyntheticSpec(context_scale=0)


def test_built_in_profiles_load_by_name_and_follow_their_sources():
    """The 70B profile's KV per token is Llama-3.1-70B's shape (2 × 80 layers × 8 heads × 128 × 2 B)."""
    assert EngineProfile.load("h100-7b") == PROFILE
    big = EngineProfile.load("b200x2-70b")
    assert big.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 and big.gpu_kv_tokens < PROFILE.gpu_kv_tokens
    assert EngineProfile.load("h200-7b").gpu_kv_tokens > PROFILE.gpu_kv_tokens


def test_replay_summary_prints_the_cross_matrix_row_of_each_cell_under_pressure(tmp_path):
    """benchmarks/replay_summary.py reads a bench replay folder: one row per cell at C ≥ 50 (one
    worker) with maitred's throughput over the best baseline's, and the range over all rows."""
    import subprocess
    import sys

    from maitred.cli import main

    out = tmp_path / "m"
    assert (
        main(
            [
                "bench",
                "replay",
                "--trace",
                "synthetic:claude-code?programs=10&max_steps=20",
                "--policy",
                "thunderagent_offload,maitred",
                "--concurrency",
                "20,50",
                "--cpu-ratio",
                "1",
                "--duration",
                "120",
                "--jobs",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    runs = json.loads((out / "results.json").read_text())["runs"]
    ours, theirs = (
        next(r["throughput_tok_s"] for r in runs if r["policy"] == p and r["concurrency"] == 50)
        for p in ("maitred", "thunderagent_offload")
    )
    script = Path(__file__).parents[1] / "benchmarks" / "replay_summary.py"
    printed = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, check=True).stdout
    rows = [line for line in printed.splitlines() if line.startswith("| m |")]
    assert len(rows) == 1 and rows[0].startswith(f"| m | 50 ×1 | {ours:.0f} | thunderagent_offload {theirs:.0f} |")
    assert f"**{ours / theirs:.2f}×**" in rows[0] and "over 1 cells" in printed
    limit = next(r["throughput_tok_s"] for r in runs if r["policy"] == "unlimited" and r["concurrency"] == 50)
    assert f"| {limit:.0f} ({ours / limit:.0%}) |" in rows[0]  # the bound beside the cell
    (tmp_path / "empty").mkdir()
    refused = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "empty")], capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stdout == "" and "Traceback" not in refused.stderr
    assert "empty/results.json: cannot read it" in refused.stderr
