"""Integration overheads: the Claude Code command hook's latency, and MaitredMiddleware's cost
inside a LangGraph agent.

1. Command hook: wall time from process start to exit of ``maitred hook claude-code`` (what
   ``examples/claude_code/settings.json`` runs) and of ``python -m
   maitred.integrations.claude_code_hook``, fed one PreToolUse payload (Python start-up
   included), median and p90 over ``--hook-runs`` runs: the events spooled for a deliverer that
   posts them to a running gateway, that keeps them while the runtime is down, or that writes
   them to a SQLite store (there each run waits for its event to be stored, and the time until
   it is is reported). A bare ``python -c pass`` in the same run is the floor: on a shared
   machine it shows how much the load inflates every figure.
2. Headless Claude Code session (``--sessions``): the real CLI (installed as the test suite
   does) runs one scripted session against ``maitred sim-worker --script`` without hooks, with
   the command hooks writing to a store, and with the http settings posting to a gateway, in
   rotation; reported: the median session time each way, the ratio to no hooks (Goal: <= 1.05),
   and the hook events lost (Goal: 0).
3. Middleware: one ``create_agent`` agent on a scripted chat model (each step one model call and
   one tool call), run with and without ``MaitredMiddleware`` in alternation; events go through
   the real emitter to a sink that counts them. Reported, in wall time and in CPU time (which a
   shared, busy machine inflates less): the middleware's own time per tool call and per model
   call, and the difference in step time, each as a share of the plain agent's step time
   (Goal: <= 2 %), and the step time with a pass-through middleware: what LangChain charges for
   having any middleware at all. The own time is measured inside the hooks, the wrapped
   handler's time taken out; the timing itself (four clock reads and a wrapper around the
   handler, 2-3 µs a hook) is measured the same way around the pass-through middleware, in a
   fourth agent, and subtracted (``measured_*`` is before, ``timing_floor_*`` the amount).

    python benchmarks/bench_integrations.py [--hook-runs 30] [--sessions 5] [--agent-runs 30] [--steps 10]

``--hook-runs 0``, ``--sessions 0``, ``--agent-runs 0`` leave that part out.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from reference import reference_s

PAYLOAD = json.dumps(
    {
        "session_id": "bench-session",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/tmp",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_use_id": "toolu_bench",
        "tool_input": {"command": "pytest -x tests", "timeout": 120000},
    }
)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_process(
    argv: list[str], env: dict[str, str], runs: int, settle: Callable[[int], float] | None = None
) -> dict[str, float]:
    """Median and p90 of process start -> exit. ``settle(i)``, when given, waits after run ``i``
    until its background work is done (so runs do not pile up) and returns how long that took."""
    samples, settled = [], []
    for i in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, input=PAYLOAD, capture_output=True, text=True, env=env, timeout=60)
        samples.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"the hook exited {done.returncode}: {done.stderr}")
        if settle is not None:
            settled.append(settle(i) + samples[-1])
    out = {"median_ms": round(statistics.median(samples) * 1000, 1), "p90_ms": round(percentile(samples, 0.9) * 1000, 1)}
    if settled:
        out["stored_after_median_ms"] = round(statistics.median(settled) * 1000, 1)
    return out


def stored(path: Path, offset: list[int]) -> Callable[[int], float]:
    """A ``settle`` for the store mode: wait until the SQLite store at ``path`` holds one more event."""

    def wait(i: int) -> float:
        start = time.perf_counter()
        while time.perf_counter() - start < 60:
            try:
                with sqlite3.connect(path) as db:
                    n = db.execute("SELECT count(*) FROM events").fetchone()[0]
            except sqlite3.Error:
                n = 0
            if n >= offset[0] + i + 1:
                return time.perf_counter() - start
            time.sleep(0.005)
        raise RuntimeError("the deliverer did not store the event within 60 s")

    return wait


def bench_hook(runs: int) -> dict[str, Any]:
    """The hook process itself: what Claude Code waits for, and may kill, on every hook event."""
    from maitred.harness.background import free_port
    from maitred.harness.local import local_cluster

    base = {k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")}
    cli = [str(Path(sys.executable).with_name("maitred")), "hook", "claude-code"]
    module = [sys.executable, "-m", "maitred.integrations.claude_code_hook"]
    out: dict[str, Any] = {
        "python_startup": time_process([sys.executable, "-c", "pass"], base, runs),
        "import_maitred": time_process([sys.executable, "-c", "import maitred"], base, runs),
    }
    with tempfile.TemporaryDirectory() as folder:
        spool = {**base, "MAITRED_SPOOL_DIR": str(Path(folder) / "spool"), "MAITRED_HOOK_LINGER_S": "5"}
        down = {**spool, "MAITRED_URL": f"http://127.0.0.1:{free_port()}"}
        path = Path(folder) / "hooks.db"
        store = {**spool, "MAITRED_DB": f"sqlite:///{path}"}
        written = [0]
        with local_cluster(script_tools=False) as cluster:
            up = {**spool, "MAITRED_URL": cluster.gateway_url}
            for name, argv in (("maitred_hook_claude_code", cli), ("python_m_module", module)):
                out[name] = {
                    "runtime_up": time_process(argv, up, runs),
                    "runtime_down_spooled": time_process(argv, down, runs),
                    "store": time_process(argv, store, runs, settle=stored(path, written)),
                }
                written[0] += runs
    return out


def bench_claude_session(runs: int) -> dict[str, Any]:
    """The hooks' cost to a real headless Claude Code session: the same scripted session (Bash
    sleeps, a failing and a timed-out command, Read, a foreground and a background subagent)
    without hooks, with the command hooks writing to a store, and with the http settings posting
    to a gateway, in rotation; and the hook events lost (the store against what the session's
    hooks fire)."""
    sys.path.insert(0, str(Path(__file__).parents[1]))  # the suite's CLI harness, one copy of it
    from maitred.harness.background import BackgroundServer
    from maitred.harness.local import local_cluster
    from maitred.integrations.claude_code_hook import settings_json
    from maitred.sim.worker.app import create_app
    from maitred.sim.worker.config import SimWorkerConfig
    from tests.integrations.claude_cli import EXPECTED, SCRIPT, claude_binary, command_hooks, run, stored_session

    binary, why = claude_binary()
    if binary is None:
        return {"skipped": why}
    times: dict[str, list[float]] = {"without_hooks": [], "command_hooks_store": [], "http_hooks_gateway": []}
    lost: dict[str, int] = {"command_hooks_store": 0, "http_hooks_gateway": 0}
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        tmp = Path(folder)
        sim = stack.enter_context(BackgroundServer(create_app(SimWorkerConfig(script=SCRIPT, time_scale=50.0))))
        gateway_db = f"sqlite:///{tmp / 'gateway.db'}"
        gateway = stack.enter_context(local_cluster(workers=1, script_tools=False, db_url=gateway_db))
        store_db = f"sqlite:///{tmp / 'sessions.db'}"
        setups = {
            "without_hooks": ({}, {}, None),
            "command_hooks_store": (json.loads(settings_json()), command_hooks(tmp, MAITRED_DB=store_db), store_db),
            "http_hooks_gateway": (
                json.loads(settings_json(http=gateway.gateway_url)),
                command_hooks(tmp, MAITRED_URL=gateway.gateway_url),  # SessionStart's command hook
                gateway_db,
            ),
        }
        names = list(setups)
        for i in range(runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate the order
                settings, env, db = setups[name]
                start = time.perf_counter()
                session = run(binary, tmp, f"{name}-{i}", sim.url, settings, env)
                times[name].append(time.perf_counter() - start)
                if db is not None:
                    got = stored_session(db, session.session_id, want=len(EXPECTED), timeout=60)
                    lost[name] += max(len(EXPECTED) - sum(1 for e in got if not e["type"].startswith("llm.")), 0)
    bare = statistics.median(times["without_hooks"])
    return {
        "sessions_each": runs,
        "median_s": {name: round(statistics.median(ts), 3) for name, ts in times.items()},
        "ratio": {name: round(statistics.median(ts) / bare, 4) for name, ts in times.items() if name != "without_hooks"},
        "hook_events_per_session": len(EXPECTED),
        "events_lost": lost,
    }


def bench_middleware(runs: int, steps: int) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    import maitred
    from maitred.integrations.langgraph import MaitredMiddleware

    class Scripted(BaseChatModel):
        """``steps`` turns that each call the tool, then an answer; resets per run."""

        n: int = 0

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            kwargs.pop("tool_choice", None)
            return self.bind(**kwargs)

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            self.n += 1
            usage = {"input_tokens": 100 + self.n, "output_tokens": 5, "total_tokens": 105 + self.n}
            if self.n <= steps:
                message = AIMessage(
                    "",
                    tool_calls=[{"name": "lookup", "args": {"key": f"k{self.n}"}, "id": f"call_{self.n}", "type": "tool_call"}],
                    usage_metadata=usage,
                )
            else:
                message = AIMessage("done", usage_metadata=usage)
            return ChatResult(generations=[ChatGeneration(message=message)])

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    class Counting:
        events = 0

        def send(self, events: Sequence[Any]) -> int:
            Counting.events += len(events)
            return 0

        def close(self) -> None:
            pass

    def timed(base: type[AgentMiddleware]) -> Any:
        """``base``, timing its own share of each hook (the handler's time taken out), in wall time
        and in this thread's CPU time (which waiting for a busy CPU does not inflate)."""

        class Timed(base):  # type: ignore[valid-type,misc]
            tool: list[tuple[float, float]] = []
            model: list[tuple[float, float]] = []

            def _timed(
                self, hook: Callable[..., Any], request: Any, handler: Callable[[Any], Any], into: list[tuple[float, float]]
            ) -> Any:
                inner_wall = inner_cpu = 0.0

                def timed_handler(r: Any) -> Any:
                    nonlocal inner_wall, inner_cpu
                    wall, cpu = time.perf_counter(), time.thread_time()
                    try:
                        return handler(r)
                    finally:
                        inner_wall += time.perf_counter() - wall
                        inner_cpu += time.thread_time() - cpu

                wall, cpu = time.perf_counter(), time.thread_time()
                result = hook(request, timed_handler)
                into.append((time.perf_counter() - wall - inner_wall, time.thread_time() - cpu - inner_cpu))
                return result

            def wrap_tool_call(self, request: Any, handler: Any) -> Any:
                return self._timed(super().wrap_tool_call, request, handler, self.tool)

            def wrap_model_call(self, request: Any, handler: Any) -> Any:
                return self._timed(super().wrap_model_call, request, handler, self.model)

        return Timed

    class PassThrough(AgentMiddleware):
        """A middleware that does nothing: what LangChain charges for having one at all."""

        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            return handler(request)

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            return handler(request)

    maitred.configure(sinks=[Counting()])
    model_plain, model_with, model_empty, model_floor = Scripted(), Scripted(), Scripted(), Scripted()
    plain = create_agent(model_plain, [lookup], name="worker")
    timed_ours, timed_floor = timed(MaitredMiddleware), timed(PassThrough)
    instrumented = create_agent(model_with, [lookup], name="worker", middleware=[timed_ours()])
    empty = create_agent(model_empty, [lookup], name="worker", middleware=[PassThrough()])
    floor = create_agent(model_floor, [lookup], name="worker", middleware=[timed_floor()])

    def one(agent: Any, model: Any, thread: str) -> tuple[float, float]:
        """(wall, process CPU) seconds per step of one run."""
        model.n = 0
        wall, cpu = time.perf_counter(), time.process_time()
        agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": thread}})
        return (time.perf_counter() - wall) / (steps + 1), (time.process_time() - cpu) / (steps + 1)

    for i in range(3):  # warm up all four
        one(plain, model_plain, f"warm-{i}")
        one(instrumented, model_with, f"warm-{i}")
        one(empty, model_empty, f"warm-{i}")
        one(floor, model_floor, f"warm-{i}")
    for kind in (timed_ours, timed_floor):
        kind.tool.clear()
        kind.model.clear()
    without, with_, pass_through = [], [], []
    for i in range(runs):
        without.append(one(plain, model_plain, f"plain-{i}"))
        with_.append(one(instrumented, model_with, f"with-{i}"))
        pass_through.append(one(empty, model_empty, f"empty-{i}"))
        one(floor, model_floor, f"floor-{i}")
    maitred.flush(timeout=10)

    def median(values: Sequence[tuple[float, float]], i: int) -> float:
        return statistics.median(v[i] for v in values)

    per_step = steps / (steps + 1)  # a run is `steps` tool-calling steps and one answer
    out: dict[str, Any] = {"steps_per_run": steps, "runs": runs, "events_delivered": Counting.events}
    for i, clock in ((0, "wall"), (1, "cpu")):
        plain_step, with_step, empty_step = median(without, i), median(with_, i), median(pass_through, i)
        tool_raw, model_raw = median(timed_ours.tool, i) * 1e6, median(timed_ours.model, i) * 1e6
        tool_floor, model_floor_us = median(timed_floor.tool, i) * 1e6, median(timed_floor.model, i) * 1e6
        tool_us, model_us = tool_raw - tool_floor, model_raw - model_floor_us
        out[clock] = {
            "step_ms_without": round(plain_step * 1000, 3),
            "step_ms_with": round(with_step * 1000, 3),
            "measured_per_tool_call_us": round(tool_raw, 1),
            "measured_per_model_call_us": round(model_raw, 1),
            "timing_floor_per_tool_call_us": round(tool_floor, 1),
            "timing_floor_per_model_call_us": round(model_floor_us, 1),
            "overhead_per_tool_call_us": round(tool_us, 1),
            "overhead_per_model_call_us": round(model_us, 1),
            "overhead_share_measured_in_hooks": round((tool_us * per_step + model_us) / 1e6 / plain_step, 4),
            "overhead_share_ab": round((with_step - plain_step) / plain_step, 4),
            "step_ms_pass_through_middleware": round(empty_step * 1000, 3),
            "langchain_share_for_any_middleware": round((empty_step - plain_step) / plain_step, 4),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hook-runs", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=5, help="headless Claude Code sessions with hooks and without (0: none)")
    parser.add_argument("--agent-runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    hook = bench_hook(args.hook_runs) if args.hook_runs > 0 else {}
    if hook:
        print("command hook (ms, median / p90):")
    for key, value in hook.items():
        print(f"  {key}: {value}")
    session = bench_claude_session(args.sessions) if args.sessions > 0 else {}
    if session:
        print(f"headless Claude Code session: {session}")
    middleware = bench_middleware(args.agent_runs, args.steps) if args.agent_runs > 0 else {}
    print("LangGraph middleware:")
    for key, value in middleware.items():
        print(f"  {key}: {value}")
    print(
        json.dumps(
            {
                "reference_s": reference_s(),
                "command_hook": hook,
                "claude_code_session": session,
                "langgraph_middleware": middleware,
                "goals": {"hook_median_ms": 100, "middleware_share": 0.02, "session_ratio": 1.05, "events_lost": 0},
            }
        )
    )


if __name__ == "__main__":
    main()
