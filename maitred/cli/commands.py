"""What each ``maitred`` subcommand does (the parser that chooses one is ``maitred.cli.parser``).

Each is a small function of the parsed arguments over the public API, returning the exit status.
Failures worth one line to the user raise ``CliError`` (exit status 1) or ``UsageError`` (2);
``maitred.cli.main`` prints them. Queries never create a database: a mistyped path says "no such
database" instead.
"""

import argparse
import json
import os
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.table import Table

from maitred.console import output_console
from maitred.storage import DatabaseTooNew, SessionStore
from maitred.storage.queries import ALL_TOOLS

console = output_console()
#: At most this many skipped trace records are listed one per line; the rest are counted.
SKIPPED_SHOWN = 20


class CliError(Exception):
    """A failure worth one line to the user, not a traceback (exit status 1)."""


class UsageError(CliError):
    """A flag value refused after parsing, e.g. a path that must not be touched (exit status 2)."""


def stderr_line(kind: str, message: str) -> None:
    """One ``maitred: KIND: message`` line on stderr, the message's whitespace folded onto it."""
    sys.stderr.write(f"maitred: {kind}: {' '.join(str(message).split())}\n")


# -- opening things ------------------------------------------------------------------------------


def _open_history(args: argparse.Namespace) -> SessionStore:
    """The store for a query: never created, and readable even when a newer maitred wrote it
    (the schema is then left as it is, and a note says so)."""
    try:
        return SessionStore(args.db, create=False)
    except DatabaseTooNew as exc:
        stderr_line("note", f"{exc}; reading it without upgrading the schema")
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
            "[italic](all)[/italic]" if r.tool == ALL_TOOLS else r.tool,
            str(r.n),
            _fmt_s(r.mean_s),
            _fmt_s(r.std_s),
            _fmt_s(r.min_s),
            _fmt_s(r.p50_s),
            _fmt_s(r.p90_s),
            _fmt_s(r.p99_s),
            _fmt_s(r.max_s),
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
            p.program_id,
            p.parent_program_id or "-",
            p.agent or "-",
            p.framework or "-",
            _fmt_ts(p.started_at),
            _fmt_s(duration),
            p.status or "running",
            str(p.tool_calls),
            str(p.llm_calls),
        )
    console.print(table)
    return 0


#: At most this many programs of a family go into one ``timeline --perfetto`` file.
PERFETTO_PROGRAMS = 1000


def cmd_timeline(args: argparse.Namespace) -> int:
    with _open_history(args) as store:
        where = store.where
        if args.perfetto:
            family = store.program_family(args.program_id, limit=PERFETTO_PROGRAMS)
            timeline = family[0] if family else None
        else:
            family, timeline = [], store.program(args.program_id)
    if timeline is None:
        raise CliError(f"no program {args.program_id!r} in {where}")
    if args.perfetto:
        from maitred.perfetto import write_trace
        from maitred.storage.perfetto import family_records

        tracks, records = family_records(family)
        with _writing("--perfetto", args.perfetto), open(args.perfetto, "w", encoding="utf-8") as out:
            n = write_trace(out, tracks, records, about={"program_id": args.program_id, "database": where})
        stderr_line("note", f"wrote {n} trace events of {len(family)} programs to {args.perfetto}")
    if args.png:
        from maitred.plots import timeline_png

        with _writing("--png", args.png):
            console.print(f"wrote {timeline_png(timeline, args.png)}")
    if args.json:
        _print_json(
            {
                "program": asdict(timeline.program),
                "spans": [asdict(s) for s in timeline.spans],
                "handoffs": timeline.handoffs,
                "totals": timeline.busy_idle(),
            }
        )
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
    console.print(
        f"Explore: maitred programs --db {args.db_file}\n"
        f"         maitred timeline {'demo' if args.offline else 'maitred'}-0 --db {args.db_file} --png timeline.png",
        soft_wrap=True,
    )
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
        stderr_line("skipped", item)
    if len(skipped) > SKIPPED_SHOWN:
        stderr_line("skipped", f"... and {len(skipped) - SKIPPED_SHOWN} more records of {name}")


def cmd_bench_replay(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from maitred.sim.bench import Matrix, perfetto_path, run_matrix, write_outputs
    from maitred.sim.profile import EngineProfile
    from maitred.sim.traces import load_trace

    trace = load_trace(args.trace)  # validate before starting processes
    _report_skipped(trace.name, trace.skipped)
    profile = EngineProfile.load(args.profile) if args.profile else EngineProfile()
    out = Path(args.out)
    _writable_folder("--out", out)
    perfetto = Path(args.perfetto) if args.perfetto else None
    if perfetto is not None:
        _writable_folder("--perfetto", perfetto)
    matrix = Matrix(
        args.trace,
        args.policy,
        args.concurrency,
        args.cpu_ratio,
        args.duration,
        args.seed,
        args.workers,
        args.gpu_tokens,
        use_signature=args.history == "signature",
        busy_margin=args.busy_margin,
        overcommit_headroom=args.overcommit_headroom,
        period_s=args.period,
        hold_timeout_s=args.hold_timeout,
    )
    total = len(matrix.configs())
    console.print(
        f"{trace.name}: {len(trace.programs)} programs; {total} runs of {args.duration:.0f} simulated s "
        f"on {args.jobs or 'all'} processes; engine: {profile.name}"
    )
    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("replaying", total=total)
        records = run_matrix(
            matrix,
            profile,
            jobs=args.jobs,
            on_done=lambda r: bar.update(task, advance=1, description=f"{r['policy']} C={r['concurrency']}"),
            perfetto=perfetto,
        )
    command = args.command_line
    with _writing("--out", out):
        for path in write_outputs(matrix, records, out, command):
            console.print(f"wrote {path}")
    if perfetto is not None:
        console.print(f"wrote {total} timelines to {perfetto}, e.g. {perfetto_path(perfetto, *matrix.configs()[0])}")
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
    console.print(
        f"wrote {out}: {profile.name}; {profile.gpu_kv_tokens:,} KV tokens, "
        f"prefill {profile.prefill_s_per_token * 1e6:.2f} µs/token, host→device {profile.h2d_bytes_per_s / 1e9:.1f} GB/s"
    )
    return 0
