"""The writer process the store's fault tests kill, run side by side, or starve of disk.

It runs in a real child process (``multiprocessing``'s forkserver, which imports maitred once,
so a hundred kills stay cheap) and reports each batch that ``SessionStore.write`` returned for
by appending a line to a file with one ``os.write``: that line survives a SIGKILL one
instruction later, so the parent knows exactly what the store said it had stored.
"""

import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from maitred.events import Event, ToolEnd, ToolStart
from maitred.storage import SessionStore
from maitred.storage.fold import fold

T0 = 1_800_000_000.0
#: SQLAlchemy engine events that make a kill point: before and after every statement, and the
#: moment before each commit.
KILL_POINTS = ("before_cursor_execute", "after_cursor_execute", "commit")


def batch_events(writer: str, batch: int, size: int) -> list[Event]:
    """``size`` events (tool start/end pairs) of one batch; the same arguments give the same
    events, so a parent can recompute what a child wrote. Writer ``shared`` is written by every
    process of a concurrency test."""
    out: list[Event] = []
    for i in range(size // 2):
        call, ts = f"b{batch}-c{i}", T0 + batch * 100 + i * 0.01
        out.append(ToolStart(ts=ts, program_id=writer, agent="a", call_id=call, tool=f"tool-{i % 7}"))
        out.append(ToolEnd(ts=ts + 0.5, program_id=writer, agent="a", call_id=call, duration_s=0.5))
    return out


def event_keys(events: list[Event]) -> set[str]:
    return {row["event_key"] for row in fold(events).events}


def forkserver() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def run_writer(
    url: str,
    report: str,
    *,
    writer: str,
    batches: int,
    size: int,
    kill_at: int = 0,
    shared: int = 0,
    start: Any = None,
    stderr: str | None = None,
) -> None:
    """Open the store and write ``batches`` batches (each followed by ``shared`` events of the
    ``shared`` program), reporting ``<writer> <batch>`` per stored batch. ``kill_at`` > 0:
    SIGKILL this process at that kill point; the last line says how many points there were."""
    if stderr is not None:  # everything this process prints, for the parent to inspect
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 2)
        sys.stderr = open(2, "w", closefd=False)
    logging.basicConfig(level=logging.WARNING)
    out = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    points = 0

    def point(*_: Any) -> None:
        nonlocal points
        points += 1
        if points == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    for name in KILL_POINTS:
        event.listen(Engine, name, point)
    if start is not None:
        start.wait()
    with SessionStore(url) as store:
        for batch in range(batches):
            result = store.write(batch_events(writer, batch, size) + batch_events("shared", batch, shared))
            assert not result.rejected, result.rejected
            os.write(out, f"{writer} {batch}\n".encode())
    os.write(out, f"points {points}\n".encode())
    os.close(out)


def reported(report: Path) -> tuple[list[tuple[str, int]], int | None]:
    """The batches a child reported stored, and its kill-point count when it ran to the end."""
    stored: list[tuple[str, int]] = []
    points = None
    for line in report.read_text().splitlines() if report.exists() else []:
        name, value = line.split()
        if name == "points":
            points = int(value)
        else:
            stored.append((name, int(value)))
    return stored, points
