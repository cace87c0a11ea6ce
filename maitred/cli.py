"""The ``maitred`` command (SPEC section 11).

Each subcommand is a small function over the public API. Every error is one line on stderr
naming the flag or the path it is about, never a traceback (unless ``MAITRED_DEBUG`` is set):
exit status 2 for a refused command line (argparse's convention), 1 for a failure while doing
the work (a missing or damaged database, an unreadable trace, a file that cannot be written).
Queries never create a database: a mistyped path says "no such database" instead.
"""

import argparse
import json
import math
import os
import shlex
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from rich.table import Table

from maitred import __version__
from maitred.console import output_console
from maitred.flags import bounded, seconds, whole
from maitred.middleware.config import default_db_url
from maitred.sim.traces import TraceError
from maitred.storage import DatabaseTooNew, SessionStore, StoreError, normalize_db_url
from maitred.storage.queries import ALL_TOOLS, parse_since

console = output_console()
#: At most this many skipped trace records are listed one per line; the rest are counted.
SKIPPED_SHOWN = 20
#: Upper bounds that turn a typo into an error instead of an hour-long run or a database overflow.
MAX_LIMIT, MAX_CONCURRENCY, MAX_WORKERS, MAX_DEMO_PROGRAMS = 10**9, 100_000, 1024, 1000


class CliError(Exception):
    """A failure worth one line to the user, not a traceback (exit status 1)."""


class UsageError(CliError):
    """A flag value refused after parsing, e.g. a path that must not be touched (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) so scripts can show them as they are."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _stderr(kind: str, message: str) -> None:
    sys.stderr.write(f"maitred: {kind}: {' '.join(str(message).split())}\n")


# -- flag value types: each refuses what the command could not use, and argparse names the flag --

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


def _csv(kind: Callable[[str], Any], allowed: Sequence[str] | None = None, maximum: float | None = None,
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


# -- opening things ------------------------------------------------------------------------------

def _open_history(args: argparse.Namespace) -> SessionStore:
    """The store for a query: never created, and readable even when a newer maitred wrote it
    (the schema is then left as it is, and a note says so)."""
    try:
        return SessionStore(args.db, create=False)
    except DatabaseTooNew as exc:
        _stderr("note", f"{exc}; reading it without upgrading the schema")
        return SessionStore(args.db, create=False, migrate=False)


@contextmanager
def _writing(flag: str, path: str | Path) -> Iterator[None]:
    """File-system failures while writing ``path`` become one line naming the flag and the path."""
    try:
        yield
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None


def _writable_folder(flag: str, path: Path) -> None:
    """Fail before a long run, not after it, when its output cannot be written."""
    with _writing(flag, path):
        path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: cannot write (permission denied)")


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f}ms" if value < 1 else f"{value:.2f}s"


def _fmt_ts(value: float | None) -> str:
    return "-" if value is None else datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def tool_stats_table(rows: Sequence[Any], title: str = "tool durations") -> Table:
    table = Table(title=title)
    table.add_column("tool", style="bold", no_wrap=True)
    for name in ("n", "mean", "std", "min", "p50", "p90", "p99", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        if r.tool == ALL_TOOLS:
            table.add_section()
        table.add_row(
            "[italic](all)[/italic]" if r.tool == ALL_TOOLS else r.tool, str(r.n), _fmt_s(r.mean_s),
            _fmt_s(r.std_s), _fmt_s(r.min_s), _fmt_s(r.p50_s), _fmt_s(r.p90_s), _fmt_s(r.p99_s), _fmt_s(r.max_s),
        )
    return table


def cmd_stats_tools(args: argparse.Namespace) -> int:
    with _open_history(args) as store:
        where = store.where
        if args.tool:
            one = store.tool_stats(args.tool, since=args.since, agent=args.agent)
            rows = [one] if one else []
        else:
            rows = store.tool_stats_all(since=args.since, agent=args.agent, by_signature=args.by_signature)
    if args.json:
        _print_json([asdict(r) for r in rows])
    elif not rows:
        console.print("no completed tool calls" + (f" for tool {args.tool!r}" if args.tool else "") + f" in {where}")
    else:
        console.print(tool_stats_table(rows))
    return 0


def cmd_programs(args: argparse.Namespace) -> int:
    with _open_history(args) as store:
        rows = store.programs(since=args.since, limit=args.limit)
    if args.json:
        _print_json([asdict(r) for r in rows])
        return 0
    table = Table(title=f"programs ({len(rows)} shown)")
    for name in ("program", "parent", "agent", "framework", "started", "duration", "status", "tools", "steps"):
        table.add_column(name, justify="right" if name in ("duration", "tools", "steps") else "left", overflow="fold")
    for p in rows:
        duration = p.ended_at - p.started_at if p.ended_at and p.started_at else None
        table.add_row(
            p.program_id, p.parent_program_id or "-", p.agent or "-", p.framework or "-", _fmt_ts(p.started_at),
            _fmt_s(duration), p.status or "running", str(p.tool_calls), str(p.llm_calls),
        )
    console.print(table)
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    with _open_history(args) as store:
        where = store.where
        timeline = store.program(args.program_id)
    if timeline is None:
        raise CliError(f"no program {args.program_id!r} in {where}")
    if args.png:
        from maitred.plots import timeline_png

        with _writing("--png", args.png):
            console.print(f"wrote {timeline_png(timeline, args.png)}")
    if args.json:
        _print_json({"program": asdict(timeline.program), "spans": [asdict(s) for s in timeline.spans],
                     "handoffs": timeline.handoffs, "totals": timeline.busy_idle()})
        return 0
    origin = timeline.spans[0].start if timeline.spans else 0.0
    table = Table(title=f"program {args.program_id}")
    for name in ("t+", "phase", "name", "agent", "duration", "status"):
        table.add_column(name, overflow="fold")
    for s in timeline.spans:
        phase = {"llm": "reasoning", "tool": "acting", "wait": "waiting"}[s.kind]
        table.add_row(f"{s.start - origin:8.3f} s", phase, s.name, s.agent or "-", _fmt_s(s.duration_s), s.status or "open")
    console.print(table)
    totals = timeline.busy_idle()
    console.print(
        f"reasoning {totals['reasoning_s']:.2f} s · acting {totals['acting_s']:.2f} s · waiting {totals['waiting_s']:.2f} s"
        f" · {len(timeline.handoffs)} handoffs"
    )
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Migrate, then check: a database is called fine only when the integrity check agrees."""
    with SessionStore(args.db) as store:
        problems = store.check_integrity()
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise CliError(f"{problems[0]}{more}")
        console.print(f"{store.where}: schema at revision {store.revision()}; integrity check passed")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    with _open_history(args) as store, _writing("--out", args.out):
        n = store.export_trace(args.out, since=args.since)
    console.print(f"wrote {n} programs to {args.out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The live demo by default (two simulated workers behind the gateway, the same agent
    programs under maitred and under round robin); ``--offline`` runs the instrumentation alone."""
    from maitred.demo import NotADemoDatabase, fresh_sqlite

    if not args.offline:
        from maitred.harness.livedemo import MAX_PROGRAMS

        if args.programs is not None and args.programs > MAX_PROGRAMS:
            raise UsageError(f"--programs: at most {MAX_PROGRAMS} in the live demo (one thread each against two workers)")
        _writable_folder("--png", Path(args.png).absolute().parent)
    try:
        db_url = fresh_sqlite(Path(args.db_file))
    except NotADemoDatabase as exc:
        raise UsageError(f"--db-file: {exc}") from None
    except (OSError, sqlite3.Error) as exc:
        raise CliError(f"--db-file {args.db_file}: cannot create ({exc})") from None
    if args.offline:
        _offline_demo(args, db_url)
    else:
        _live_demo(args, db_url)
    console.print(f"Explore: maitred programs --db {args.db_file}\n"
                  f"         maitred timeline {'demo' if args.offline else 'maitred'}-0 --db {args.db_file} --png timeline.png",
                  soft_wrap=True)
    return 0


def _live_demo(args: argparse.Namespace, db_url: str) -> None:
    from maitred.harness.livedemo import LiveDemoConfig, print_summary, run_live_demo

    programs = args.programs or LiveDemoConfig.programs
    # GPU memory for about half of the programs' contexts: where the policy matters.
    gpu_tokens = max(40_000, programs * 3_750)
    cfg = LiveDemoConfig(programs=programs, seed=args.seed, steps=args.steps, gpu_tokens=gpu_tokens, cpu_tokens=2 * gpu_tokens)
    png = Path(args.png)
    with _writing("--png", png):
        runs = run_live_demo(cfg, db_url, png, progress=console.print)
    print_summary(runs, png)


def _offline_demo(args: argparse.Namespace, db_url: str) -> None:
    from maitred.demo import run_demo

    console.print(f"running {args.programs or 6} instrumented agent programs into {db_url} ...")
    run_demo(db_url, programs=args.programs or 6, seed=args.seed)
    with SessionStore(db_url, create=False) as store:
        console.print(tool_stats_table(store.tool_stats_all(), title="demo: tool durations (maitred stats tools)"))
        programs = store.programs()
    console.print(
        f"{len(programs)} programs, {sum(p.tool_calls for p in programs)} tool calls, "
        f"{sum(p.llm_calls for p in programs)} model steps recorded.",
        soft_wrap=True,
    )


def _report_skipped(name: str, skipped: Sequence[str]) -> None:
    """Each record a trace reader refused, one stderr line each (the first few), then a count."""
    for item in skipped[:SKIPPED_SHOWN]:
        _stderr("skipped", item)
    if len(skipped) > SKIPPED_SHOWN:
        _stderr("skipped", f"... and {len(skipped) - SKIPPED_SHOWN} more records of {name}")


def cmd_bench_replay(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from maitred.sim.bench import Matrix, run_matrix, write_outputs
    from maitred.sim.profile import EngineProfile
    from maitred.sim.traces import load_trace

    trace = load_trace(args.trace)  # validate before starting processes
    _report_skipped(trace.name, trace.skipped)
    profile = EngineProfile.load(args.profile) if args.profile else EngineProfile()
    out = Path(args.out)
    _writable_folder("--out", out)
    matrix = Matrix(args.trace, args.policy, args.concurrency, args.cpu_ratio, args.duration, args.seed,
                    args.workers, args.gpu_tokens, use_signature=args.history == "signature",
                    busy_margin=args.busy_margin, overcommit_headroom=args.overcommit_headroom,
                    period_s=args.period, hold_timeout_s=args.hold_timeout)
    total = len(matrix.configs())
    console.print(f"{trace.name}: {len(trace.programs)} programs; {total} runs of {args.duration:.0f} simulated s "
                  f"on {args.jobs or 'all'} processes; engine: {profile.name}")
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task("replaying", total=total)
        records = run_matrix(matrix, profile, jobs=args.jobs,
                             on_done=lambda r: bar.update(task, advance=1, description=f"{r['policy']} C={r['concurrency']}"))
    command = args.command_line
    with _writing("--out", out):
        for path in write_outputs(matrix, records, out, command):
            console.print(f"wrote {path}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from maitred.sim.calibrate import calibrate, resolve_device

    try:
        resolve_device(args.device)
    except ValueError as exc:
        raise UsageError(f"--device {exc}") from None
    out = Path(args.out)
    _writable_folder("--out", out.parent)
    profile = calibrate(args.device, progress=lambda stage: console.print(f"measuring {stage} ..."))
    with _writing("--out", out):
        profile.save(out)
    console.print(f"wrote {out}: {profile.name}; {profile.gpu_kv_tokens:,} KV tokens, "
                  f"prefill {profile.prefill_s_per_token * 1e6:.2f} µs/token, host→device {profile.h2d_bytes_per_s / 1e9:.1f} GB/s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="maitred", description="Agent-aware serving for LLM agents.")
    parser.add_argument("--version", action="version", version=__version__, help="print maitred's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def db_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", type=_db_url, help="database URL or SQLite file path (default: $MAITRED_DB or maitred.db)")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str, parent: Any = sub) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help, description=help)
        p.set_defaults(func=fn)
        return p

    since_help = "only what ended after: 1h, 30m, 2d, an ISO date or unix seconds (not in the future)"
    stats = sub.add_parser("stats", help="history statistics").add_subparsers(dest="what", required=True, metavar="WHAT")
    p = add("tools", cmd_stats_tools, "tool-call duration statistics per tool", stats)
    db_flag(p)
    p.add_argument("--since", type=_since, help=since_help)
    p.add_argument("--tool", help="one tool only")
    p.add_argument("--agent", help="one agent only")
    p.add_argument("--by-signature", action="store_true", help="group by tool signature (e.g. Bash:pytest) instead of tool")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")

    p = add("programs", cmd_programs, "recorded programs, newest first")
    db_flag(p)
    p.add_argument("--since", type=_since, help=since_help)
    p.add_argument("--limit", type=whole(1, MAX_LIMIT), default=100, help="at most this many programs (default: 100)")
    p.add_argument("--json", action="store_true")

    p = add("timeline", cmd_timeline, "one program's busy/idle phases")
    p.add_argument("program_id")
    db_flag(p)
    p.add_argument("--png", help="also draw the timeline to this PNG file")
    p.add_argument("--json", action="store_true")

    db = sub.add_parser("db", help="database schema").add_subparsers(dest="what", required=True, metavar="WHAT")
    db_flag(add("upgrade", cmd_db_upgrade, "create or migrate the schema to the newest revision, then check its integrity", db))

    p = add("export", cmd_export, "write the history as a replayable JSONL trace")
    db_flag(p)
    p.add_argument("--out", required=True, help="trace file to write")
    p.add_argument("--since", type=_since, help=since_help)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True, metavar="WHAT")
    from maitred.sim.replay import DEFAULT_POLICIES, SIM_POLICIES, UNLIMITED_TOKENS

    p = add("replay", cmd_bench_replay, "replay a trace against every policy on simulated workers", bench)
    p.add_argument("--trace", required=True, help="SWE-agent folder, TraceLab or maitred JSONL, or synthetic:claude-code[?options]")
    p.add_argument("--policy", type=_csv(str, list(SIM_POLICIES)), default=DEFAULT_POLICIES,
                   help=f"comma-separated, of {','.join(SIM_POLICIES)} (default: all but the ablations maitred_no_preprefill and maitred_write_through)")
    p.add_argument("--concurrency", type=_csv(int, maximum=MAX_CONCURRENCY), default=(20, 50, 80),
                   help="concurrent programs per run, comma-separated (default: 20,50,80)")
    p.add_argument("--cpu-ratio", type=_csv(float), default=(1.0, 2.0),
                   help="host KV memory as a multiple of GPU KV memory, comma-separated (default: 1,2)")
    p.add_argument("--duration", type=seconds, default=3600.0, help="simulated seconds per run (default: 3600)")
    p.add_argument("--seed", type=int, default=0, help="(default: 0)")
    p.add_argument("--workers", type=whole(1, MAX_WORKERS), default=1,
                   help="simulated GPU workers (data-parallel ranks; default: 1)")
    p.add_argument("--gpu-tokens", type=whole(1, UNLIMITED_TOKENS), help="GPU KV capacity per worker (default: the profile's)")
    p.add_argument("--profile", help="engine profile: a built-in name (h100-7b, h200-7b, b200x2-70b) or a JSON file "
                                     "(maitred calibrate writes one)")
    p.add_argument("--history", choices=("signature", "tool"), default="signature",
                   help="tool-duration history for readiness: per signature (Bash:pytest) or per tool (default: signature)")
    p.add_argument("--busy-margin", type=bounded(0.0, 1.0, open_low=True),
                   help="maitred's GPU-tier fill, as maitred serve --busy-margin (default: 0.9)")
    p.add_argument("--overcommit-headroom", type=bounded(0.0, 10.0),
                   help="maitred's admitted KV beyond GPU and host, in GPUs, as maitred serve (default: 0.4)")
    p.add_argument("--period", type=seconds, help="step period for every policy, in s (default: each policy's own: "
                                                  "5 for ThunderAgent and MORI, 1 for maitred and TAO)")
    p.add_argument("--hold-timeout", type=bounded(0.0, 1e9), help="seconds a held request waits before it is forced in, "
                                                                  "for every policy (default: each policy's own, 1800)")
    p.add_argument("--jobs", type=whole(1), help="processes (default: all cores)")
    p.add_argument("--out", required=True, help="folder for results.json, report.md and the PNG plots")

    p = add("calibrate", cmd_calibrate, "measure an engine profile on this machine with torch")
    p.add_argument("--out", required=True, help="profile JSON to write")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")

    _add_plugged(sub)

    p = add("demo", cmd_demo, "agent programs through the gateway to two simulated workers, maitred against round robin")
    p.add_argument("--db-file", default="maitred-demo.db", help="SQLite file to (re)create; only ever replaces an earlier demo's")
    p.add_argument("--programs", type=whole(1, MAX_DEMO_PROGRAMS), default=None,
                   help="agent programs (threads) to run (default: 32, or 6 with --offline)")
    p.add_argument("--steps", type=whole(1, 64), default=8, help="model steps of each live program (default: 8)")
    p.add_argument("--png", default="maitred-demo.png", help="figure of the live runs (default: maitred-demo.png)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--offline", action="store_true",
                   help="no gateway: the instrumentation alone writes a small multi-agent workload into SQLite (seconds)")
    return parser


def _add_plugged(sub: Any) -> None:
    """Commands whose code lives with the runtime service and the integrations. Their modules
    import only the standard library at top level (FastAPI, uvicorn and the engine load inside
    ``run``), own their flags, defaults and error messages, and are called as they are."""
    from maitred.gateway import serve
    from maitred.integrations import claude_code
    from maitred.sim.worker import server as simworker

    def plug(parent: Any, name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int]) -> None:
        p = parent.add_parser(name, help=help, description=help)
        add_arguments(p)
        p.set_defaults(func=run, plugged=True)

    plug(sub, "serve", "the gateway in front of SGLang workers (OpenAI-compatible, with the scheduler)",
         serve.add_arguments, serve.run)
    plug(sub, "sglang-args", "print the SGLang launch lines maitred relies on, one per GPU",
         serve.add_sglang_args_arguments, serve.run_sglang_args)
    plug(sub, "sim-worker", "a simulated SGLang server for tests and demos (no GPU; never a model)",
         simworker.add_arguments, simworker.run)
    hook = sub.add_parser("hook", help="agent hooks").add_subparsers(dest="what", required=True, metavar="WHAT")
    plug(hook, "claude-code", "record one Claude Code hook payload read on stdin (always exits 0)",
         claude_code.add_arguments, claude_code.run)


def _default_db() -> str:
    """``$MAITRED_DB`` or ``maitred.db``, checked here so a bad variable is named as such."""
    try:
        return normalize_db_url(default_db_url())
    except StoreError as exc:
        raise UsageError(f"$MAITRED_DB: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = "maitred " + shlex.join(argv)  # what reports print as the command that made them
    try:
        if not getattr(args, "plugged", False) and "db" in vars(args) and args.db is None:
            args.db = _default_db()
        return int(args.func(args))
    except UsageError as exc:
        _stderr("error", str(exc))
        return 2
    except (CliError, StoreError, TraceError, ValueError) as exc:
        _stderr("error", str(exc))
        return 1
    except Exception as exc:
        if os.environ.get("MAITRED_DEBUG"):
            raise
        _stderr("error", f"{type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
