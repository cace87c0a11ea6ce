"""``benchmarks/bench_live.py`` end to end, tiny: two programs of the light load for a few
seconds through maitred (and sglang-router's round_robin when it is installed), each in front of
its own simulated workers; the JSON line carries every figure, and nothing failed."""

import asyncio
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

from maitred.harness.background import BackgroundServer
from maitred.harness.livedemo import RunSummary, Target, drive
from maitred.sim.traces.synthetic import SyntheticSpec, generate
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
FIGURES = {
    "out_tok_s",
    "ttft_mean_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "requests",
    "errors",
    "cache_hit_rate",
    "gateway_cpu_s",
    "cpu_ms_per_request",
}


def test_bench_live_reports_every_figure_for_each_system_without_errors(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports its siblings, as when run from there
    from bench_live import main

    router = importlib.util.find_spec("sglang_router") is not None
    result = main(["--loads", "light", "--programs", "2", "--duration", "4", "--systems", "maitred,round_robin"])

    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1]) == result
    assert "thunderagent" not in err  # not asked for: no line about it
    assert ("sglang-router is not installed" in err) is not router
    rows = result["loads"]["light"]
    assert list(rows) == (["maitred", "round_robin"] if router else ["maitred"])
    for row in rows.values():
        assert set(row) == FIGURES
        assert row["errors"] == 0 and row["requests"] > 0 and row["out_tok_s"] > 0
        assert row["ttft_mean_s"] > 0 and row["gateway_cpu_s"] >= 0
    assert result["reference_s"] > 0 and result["config"]["programs"] == {"light": 2}
    assert result["maitred_tool_calls_known_at_start"] == {"light": [0]}  # a fresh store
    if router:
        assert result["ratios"]["light"]["best_router"] == "round_robin"
        assert result["ratios"]["light"]["out_tok_s_vs_best_router"] > 0


def test_learned_stats_start_maitred_with_the_tool_calls_of_a_warming_window(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bench_live import main

    result = main(["--loads", "light", "--programs", "2", "--duration", "4", "--systems", "maitred", "--learned-stats"])
    assert result["config"]["learned_stats"] is True
    assert result["maitred_tool_calls_known_at_start"]["light"][0] > 0
    assert result["loads"]["light"]["maitred"]["errors"] == 0


def test_bench_live_names_an_unknown_load(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bench_live import main

    with pytest.raises(SystemExit):
        main(["--loads", "light,huge"])
    assert "--loads: unknown huge; choose from light, oversubscribed" in capsys.readouterr().err


def test_maitred_args_reach_maitred_serve_and_a_bad_string_is_refused(monkeypatch, capsys):
    """``--maitred-args`` is split as a shell would and added to ``maitred serve``'s command: a
    flag serve does not know stops the run with serve's own exit status 2 in the error."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bench_live import main

    with pytest.raises(SystemExit):
        main(["--maitred-args", '"unclosed'])
    assert "--maitred-args: No closing quotation" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match=r"--no-such-flag .*exited with status 2"):
        main(["--loads", "light", "--programs", "1", "--duration", "1", "--systems", "maitred", "--maitred-args=--no-such-flag"])


def _recording(app: Any, seen: list[tuple[str, dict[bytes, bytes], bytes]]) -> Any:
    """``app`` that first notes each HTTP request's path, headers and body; it answers
    ``POST /programs/release`` itself (ThunderAgent's route) and holds ``/v1/chat/completions``
    for ever when it carries an ``x-hold`` header."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        seen.append((scope["path"], dict(scope["headers"]), body))
        if scope["path"] == "/programs/release":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
            return await send({"type": "http.response.body", "body": b"{}"})
        if b"x-hold" in dict(scope["headers"]):
            await asyncio.sleep(3600)  # cancelled when the client goes away and the server stops

        replayed = False

        async def replay() -> dict[str, Any]:  # the body once, then what the client does next
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return wrapped


def test_agents_name_their_program_as_the_target_reads_it_and_release_it_at_the_end():
    """A router's manual policy gets the program id in its header and none in the body; a
    ThunderAgent-like target gets ``POST /programs/release`` once each program is done."""
    seen: list[tuple[str, dict[bytes, bytes], bytes]] = []
    trace = generate(SyntheticSpec(programs=2, seed=0, min_steps=2, max_steps=2))
    worker = create_app(SimWorkerConfig(gpu_tokens=100_000, time_scale=1000))
    with BackgroundServer(_recording(worker, seen)) as server:
        run = RunSummary("t")
        target = Target(
            server.url,
            program_id_in_body=False,
            program_header="x-smg-routing-key",
            instrumented=False,
            release_path="/programs/release",
        )
        drive(target, trace, run, slots=2, steps=2, time_scale=0.001, pid_prefix="p-")
    assert run.errors == 0 and run.completed == 4 and run.output_tokens > 0
    chats = [(h, json.loads(b)) for path, h, b in seen if path == "/v1/chat/completions"]
    assert sorted(h[b"x-smg-routing-key"] for h, _ in chats) == [b"p-0", b"p-0", b"p-1", b"p-1"]
    assert all("program_id" not in body for _, body in chats)
    released = sorted(json.loads(b)["program_id"] for path, _, b in seen if path == "/programs/release")
    assert released == ["p-0", "p-1"]


def test_a_request_held_past_the_deadline_ends_with_the_window_and_is_not_counted():
    """A gateway holding a request (as ThunderAgent and maitred do under pressure) must not keep
    the window open: the agent stops waiting at the deadline; nothing counts as an error."""
    seen: list[tuple[str, dict[bytes, bytes], bytes]] = []
    trace = generate(SyntheticSpec(programs=1, seed=0, min_steps=2, max_steps=2))
    worker = create_app(SimWorkerConfig(gpu_tokens=100_000, time_scale=1000))
    with BackgroundServer(_recording(worker, seen)) as server:
        run = RunSummary("t")
        target = Target(server.url, program_header="x-hold", instrumented=False)
        deadline = time.monotonic() + 1.0
        drive(target, trace, run, slots=1, steps=2, time_scale=0.001, deadline=deadline)
    assert time.monotonic() >= deadline
    assert run.errors == 0 and run.completed == 0 and run.ttft_s == [] and len(seen) == 1
