"""The ``maitred`` command line: its subcommands, their flags and the types that check flag values
(each refuses what the command could not use, and argparse names the flag). What a subcommand
does is in ``maitred.cli.commands``; commands whose code lives elsewhere bring their own flags.
"""

import argparse
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from maitred import __version__
from maitred.cli import commands
from maitred.config_file import ConfigError, ConfigSpec, run_configured
from maitred.flags import bounded, seconds, whole
from maitred.storage import StoreError, normalize_db_url
from maitred.storage.queries import parse_since

#: Upper bounds that turn a typo into an error instead of an hour-long run or a database overflow.
MAX_LIMIT, MAX_CONCURRENCY, MAX_WORKERS, MAX_DEMO_PROGRAMS = 10**9, 100_000, 1024, 1000
SINCE_HELP = "only what ended after: 1h, 30m, 2d, an ISO date or unix seconds (not in the future)"

Command = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) so scripts can show them as they are."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _since(text: str) -> float:
    try:
        value = parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("since: ")) from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time")
    if value > time.time():
        raise argparse.ArgumentTypeError(f"{text!r} is in the future, so nothing could match")
    return value


def _db_url(text: str) -> str:
    """A database URL or a plain file path (``x.db`` means ``sqlite:///<absolute x.db>``)."""
    try:
        return normalize_db_url(text)
    except StoreError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _csv(
    kind: Callable[[str], Any],
    allowed: Sequence[str] | None = None,
    maximum: float | None = None,
) -> Callable[[str], tuple]:
    """A comma-separated flag value (argparse names the flag in its error)."""

    def parse(text: str) -> tuple:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("give at least one value")
        try:
            values = tuple(kind(t) for t in items)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
        if allowed is not None:
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise argparse.ArgumentTypeError(f"unknown {', '.join(map(str, unknown))}; choose from {', '.join(allowed)}")
        if kind is int and min(values) <= 0:
            raise argparse.ArgumentTypeError("values must be positive")
        if maximum is not None and max(values) > maximum:
            raise argparse.ArgumentTypeError(f"values must be at most {maximum:,}")
        if kind is float and not all(math.isfinite(v) and v >= 0 for v in values):
            raise argparse.ArgumentTypeError("values must be finite and non-negative")
        return values

    return parse


def _db_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=_db_url, help="database URL or SQLite file path (default: $MAITRED_DB or maitred.db)")


def _add(parent: Any, name: str, fn: Command, help: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
    p.set_defaults(func=fn)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="maitred", description="Agent-aware serving for LLM agents.")
    parser.add_argument("--version", action="version", version=__version__, help="print maitred's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_history(sub)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True, metavar="WHAT")
    _add_bench_replay(bench)
    p = _add(sub, "calibrate", commands.cmd_calibrate, "measure an engine profile on this machine with torch")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    _add_plugged(sub)
    _add_demo(sub)
    return parser


def _add_history(sub: Any) -> None:
    """The queries of the session history, its schema upgrade and its export as a trace."""
    stats = sub.add_parser("stats", help="history statistics").add_subparsers(dest="what", required=True, metavar="WHAT")
    p = _add(stats, "tools", commands.cmd_stats_tools, "tool-call duration statistics per tool")
    _db_flag(p)
    p.add_argument("--since", type=_since, help=SINCE_HELP)
    p.add_argument("--tool", help="one tool only")
    p.add_argument("--agent", help="one agent only")
    p.add_argument("--by-signature", action="store_true", help="group by tool signature (e.g. Bash:pytest) instead of tool")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")

    p = _add(sub, "programs", commands.cmd_programs, "recorded programs, newest first")
    _db_flag(p)
    p.add_argument("--since", type=_since, help=SINCE_HELP)
    p.add_argument("--limit", type=whole(1, MAX_LIMIT), default=100, help="at most this many programs (default: 100)")
    p.add_argument("--json", action="store_true")

    p = _add(sub, "timeline", commands.cmd_timeline, "one program's busy/idle phases")
    p.add_argument("program_id")
    _db_flag(p)
    p.add_argument("--png", help="also draw the timeline to this PNG file")
    p.add_argument(
        "--perfetto",
        metavar="FILE",
        help="also write the program and its child programs as Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev)",
    )
    p.add_argument("--json", action="store_true")

    db = sub.add_parser("db", help="database schema").add_subparsers(dest="what", required=True, metavar="WHAT")
    _db_flag(
        _add(
            db,
            "upgrade",
            commands.cmd_db_upgrade,
            "create or migrate the schema to the newest revision, then check its integrity",
        )
    )

    p = _add(sub, "export", commands.cmd_export, "write the history as a replayable JSONL trace")
    _db_flag(p)
    p.add_argument("--out", required=True, help="trace file to write")
    p.add_argument("--since", type=_since, help=SINCE_HELP)


def _add_bench_replay(bench: Any) -> None:
    from maitred.sim.replay import DEFAULT_POLICIES, SIM_POLICIES, UNLIMITED_TOKENS

    p = _add(bench, "replay", commands.cmd_bench_replay, "replay a trace against every policy on simulated workers")
    p.add_argument(
        "--trace", required=True, help="SWE-agent folder, TraceLab or maitred JSONL, or synthetic:claude-code[?options]"
    )
    p.add_argument(
        "--policy",
        type=_csv(str, list(SIM_POLICIES)),
        default=DEFAULT_POLICIES,
        help=f"comma-separated, of {','.join(SIM_POLICIES)} (default: all but the ablations maitred_no_preprefill and maitred_write_through)",
    )
    p.add_argument(
        "--concurrency",
        type=_csv(int, maximum=MAX_CONCURRENCY),
        default=(20, 50, 80),
        help="concurrent programs per run, comma-separated (default: 20,50,80)",
    )
    p.add_argument(
        "--cpu-ratio",
        type=_csv(float),
        default=(1.0, 2.0),
        help="host KV memory as a multiple of GPU KV memory, comma-separated (default: 1,2)",
    )
    p.add_argument("--duration", type=seconds, default=3600.0, help="simulated seconds per run (default: 3600)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument(
        "--workers", type=whole(1, MAX_WORKERS), default=1, help="simulated GPU workers (data-parallel ranks; default: 1)"
    )
    p.add_argument("--gpu-tokens", type=whole(1, UNLIMITED_TOKENS), help="GPU KV capacity per worker (default: the profile's)")
    p.add_argument(
        "--profile",
        help="engine profile: a built-in name (h100-7b, h200-7b, b200x2-70b) or a JSON file (maitred calibrate writes one)",
    )
    p.add_argument(
        "--history",
        choices=("signature", "tool"),
        default="signature",
        help="tool-duration history for readiness: per signature (Bash:pytest) or per tool (default: signature)",
    )
    p.add_argument(
        "--busy-margin",
        type=bounded(0.0, 1.0, open_low=True),
        help="maitred's GPU-tier fill, as maitred serve --busy-margin (default: 0.9)",
    )
    p.add_argument(
        "--overcommit-headroom",
        type=bounded(0.0, 10.0),
        help="maitred's admitted KV beyond GPU and host, in GPUs, as maitred serve (default: 0.4)",
    )
    p.add_argument(
        "--period",
        type=seconds,
        help="step period for every policy, in s (default: each policy's own: "
        "5 for ThunderAgent and MORI, 1 for maitred and TAO)",
    )
    p.add_argument(
        "--hold-timeout",
        type=bounded(0.0, 1e9),
        help="seconds a held request waits before it is forced in, for every policy (default: each policy's own, 1800)",
    )
    p.add_argument("--jobs", type=whole(1), help="processes (default: all cores)")
    p.add_argument("--out", required=True, help="folder for results.json, report.md and the PNG plots")
    p.add_argument(
        "--perfetto",
        metavar="DIR",
        help="also write each run's timeline (programs, model and tool calls, handoffs, admissions, tier moves) "
        "as Chrome/Perfetto trace-event JSON into this folder, one file per run",
    )


def _configured(run: Command, args: argparse.Namespace) -> int:
    """``run`` with its settings from the environment and ``--config FILE`` filled in; a refused
    setting is a refused command line (exit status 2)."""
    try:
        return run_configured(run, args)
    except ConfigError as exc:
        raise commands.UsageError(str(exc)) from None


def _add_plugged(sub: Any) -> None:
    """Commands whose code lives with the gateway, the sim-worker and the integrations. Their modules
    import only the standard library at top level (FastAPI, uvicorn and the engine load inside
    ``run``), own their flags, defaults and error messages, and are called as they are."""
    from maitred.gateway import serve
    from maitred.integrations import claude_code_hook
    from maitred.sim.worker import server as simworker

    def plug(
        parent: Any,
        name: str,
        help: str,
        add_arguments: Callable[[argparse.ArgumentParser], None],
        run: Callable[[argparse.Namespace], int],
        config: ConfigSpec | None = None,
    ) -> None:
        p = parent.add_parser(name, help=help, description=help)
        add_arguments(p)
        if config is not None:
            config.layer(p)
            run = functools.partial(_configured, run)
        p.set_defaults(func=run, plugged=True)

    plug(
        sub,
        "serve",
        "the gateway in front of SGLang workers (OpenAI-compatible, with the scheduler)",
        serve.add_arguments,
        serve.run,
        serve.CONFIG,
    )
    plug(
        sub,
        "sglang-args",
        "print the SGLang launch lines maitred relies on, one per GPU",
        serve.add_sglang_args_arguments,
        serve.run_sglang_args,
    )
    plug(
        sub,
        "sim-worker",
        "a simulated SGLang server for tests and demos (no GPU; never a model)",
        simworker.add_arguments,
        simworker.run,
        simworker.CONFIG,
    )
    hook = sub.add_parser("hook", help="agent hooks").add_subparsers(dest="what", required=True, metavar="WHAT")
    plug(
        hook,
        "claude-code",
        "record one Claude Code hook payload read on stdin (always exits 0)",
        claude_code_hook.add_arguments,
        claude_code_hook.run,
    )


def _add_demo(sub: Any) -> None:
    p = _add(
        sub, "demo", commands.cmd_demo, "agent programs through the gateway to two simulated workers, maitred against round robin"
    )
    p.add_argument("--db-file", default="maitred-demo.db", help="SQLite file to (re)create; only ever replaces an earlier demo's")
    p.add_argument(
        "--programs",
        type=whole(1, MAX_DEMO_PROGRAMS),
        default=None,
        help="agent programs (threads) to run (default: 32, or 6 with --offline)",
    )
    p.add_argument("--steps", type=whole(1, 64), default=8, help="model steps of each live program (default: 8)")
    p.add_argument("--png", default="maitred-demo.png", help="figure of the live runs (default: maitred-demo.png)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--offline",
        action="store_true",
        help="no gateway: the instrumentation alone writes a small multi-agent workload into SQLite (seconds)",
    )
