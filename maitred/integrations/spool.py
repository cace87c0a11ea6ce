"""A per-user spool between Claude Code's command hooks and where their events go.

Why: Claude Code cancels async command hooks that are still running when a headless turn ends
(SIGTERM about 0.2 s after they start, then the process tree goes with the session), and a hook
that posts to the runtime or opens the store itself needs from 0.2 s to over a second. So the
hook does only what must happen before it can be killed, in a few milliseconds: one ``write`` of
the payload, stamped with the time it arrived, to the end of a spool file. A *deliverer* process
(one per destination, started by the first hook that finds none, in its own session so the end
of Claude Code's process tree does not take it) reads the spool in order and delivers the
events: to the runtime (``POST /v1/events``, one kept-alive connection) or to the store (opened
once, with its schema check once, for every hook of a session). It lingers a while after the
spool runs dry so that one writer serves a whole session, then exits.

Nothing read is lost: a line leaves the spool only once it is delivered (the offset delivered
so far is kept beside the spool), a runtime that is down keeps the events in the spool for the
next deliverer, and a payload that cannot be mapped is named in the log and skipped, never
holding back the lines beside it.

Layout, under ``$MAITRED_SPOOL_DIR`` (default ``$XDG_STATE_HOME/maitred/spool``, else
``~/.local/state/maitred/spool``), one folder per destination::

    <key>/spool         one line per hook (its events, a JSON array), appended under a shared lock
    <key>/offset        bytes of the spool already delivered
    <key>/deliver.lock  held (exclusively) by the one deliverer of this destination
    <key>/log           the deliverer's stderr: what it skipped or could not deliver

Concurrency: hooks append under ``flock(LOCK_SH)`` on the spool; the deliverer empties a spool it
has delivered entirely only under ``LOCK_EX``, so no append is cut. A deliverer about to exit
releases its lock *then* looks for lines that came in meanwhile, while a hook appends *then*
looks for a deliverer: one of the two always sees the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Destination", "Spool", "default_state_dir", "deliver_forever", "spool_dir"]

#: A spool over this many bytes takes no more lines (a destination down for days must not fill
#: the disk); the hook says so on stderr.
MAX_SPOOL_BYTES = 256 * 1024 * 1024
#: Events sent in one ``POST /v1/events`` or one store write.
BATCH_EVENTS = 500
#: An emptied spool is truncated once it has grown past this (it is only ever appended to).
COMPACT_BYTES = 1024 * 1024


def default_state_dir() -> Path:
    """Where maitred keeps per-user state: ``$XDG_STATE_HOME/maitred``, else ``~/.local/state/maitred``."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "maitred"


class Destination(NamedTuple):
    """Where a spool's events go: the runtime at ``url`` (falling back to the store ``db`` when it
    answers 5xx or not at all), or the store ``db`` alone. (A ``NamedTuple``: the hook runs on
    every hook event, and ``dataclasses`` costs it ~5 ms to import.)"""

    url: str | None
    db: str | None
    token: str | None = None

    @property
    def key(self) -> str:
        text = json.dumps([self.url, self.db, hashlib.sha256((self.token or "").encode()).hexdigest()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return " then ".join(x for x in (self.url, self.db) if x) or "nowhere"


def spool_dir(destination: Destination) -> Path:
    root = os.environ.get("MAITRED_SPOOL_DIR")
    return (Path(root) if root else default_state_dir() / "spool") / destination.key


class Spool:
    """One destination's spool folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "spool"
        self.offset_path = folder / "offset"
        self.lock_path = folder / "deliver.lock"
        self.log_path = folder / "log"

    # -- the hook's side ------------------------------------------------------------------------

    def append(self, record: bytes) -> None:
        """Add one record (JSON, no line break) with a single ``write``. Raises ``OSError`` when
        it cannot (the caller delivers inline instead), ``SpoolFull`` past ``MAX_SPOOL_BYTES``."""
        line = record + b"\n"
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_size + len(line) > MAX_SPOOL_BYTES:
                raise SpoolFull(f"{self.path} holds {MAX_SPOOL_BYTES} bytes not yet delivered")
            os.write(fd, line)
        finally:
            os.close(fd)

    def deliverer_running(self) -> bool:
        """Whether a deliverer holds this spool (a free lock is taken and released at once)."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the lock if this process took it
        return False

    # -- the deliverer's side -------------------------------------------------------------------

    @contextlib.contextmanager
    def delivering(self) -> Iterator[bool]:
        """Hold the deliverer lock for the block; yields False when another deliverer has it."""
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def delivered(self) -> int:
        try:
            return int(self.offset_path.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def mark_delivered(self, offset: int) -> None:
        tmp = self.offset_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self.offset_path)

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def pending(self, offset: int, limit: int) -> tuple[list[bytes], int]:
        """Whole lines past ``offset`` (at most ``limit``), and the offset after them."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                chunk = f.read(16 * 1024 * 1024)
        except FileNotFoundError:
            return [], offset
        end = chunk.rfind(b"\n")
        if end < 0:
            return [], offset
        lines = chunk[: end + 1].split(b"\n")[:-1]
        if len(lines) > limit:
            lines = lines[:limit]
            end = sum(len(x) + 1 for x in lines) - 1
        return lines, offset + end + 1

    def compact(self, offset: int) -> int:
        """Empty a spool delivered to its end (under the exclusive lock, so no append is cut);
        returns the new offset."""
        if offset < COMPACT_BYTES:
            return offset
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size != offset:
                return offset  # lines came in: deliver them first
            os.ftruncate(fd, 0)
            self.mark_delivered(0)
            return 0
        finally:
            os.close(fd)


class SpoolFull(OSError):
    """The spool holds ``MAX_SPOOL_BYTES`` not yet delivered."""


#: Delivers one batch of wire events; returns None when they are delivered (or refused for
#: their content: retrying cannot help), else what went wrong, and the batch is tried again.
Deliver = Callable[[Sequence[dict[str, Any]]], str | None]


def deliver_forever(
    spool: Spool,
    map_line: Callable[[bytes], list[dict[str, Any]]],
    deliver: Deliver,
    say: Callable[[str], None],
    *,
    linger_s: float,
    give_up_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Deliver the spool in order until it has been dry for ``linger_s``, or the destination has
    failed for ``give_up_s`` (the lines stay for the next deliverer). ``map_line`` turns one line
    into wire events and raises ``ValueError`` for a line to skip; ``say`` tells the user what
    was skipped or kept. Returns True when it stopped on a dry spool, False when it gave up."""
    offset = spool.delivered()
    idle_since = time.monotonic()
    failing_since: float | None = None
    pause = 0.005
    while True:
        if spool.size() < offset:
            offset = 0  # the spool was removed or replaced under us: it starts again
        lines, after = spool.pending(offset, BATCH_EVENTS)
        if not lines:
            offset = spool.compact(offset)
            if time.monotonic() - idle_since >= linger_s:
                return True
            sleep(pause)
            pause = min(pause * 2, 0.1)
            continue
        events: list[dict[str, Any]] = []
        for line in lines:
            try:
                events.extend(map_line(line))
            except ValueError as exc:
                say(f"skipped a spooled line of {spool.path}: {exc}")
        error = deliver(events) if events else None
        if error is not None:
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since >= give_up_s:
                say(f"{len(events)} events kept in {spool.path} for the next delivery: {error}")
                return False
            sleep(min(1.0, 0.05 * 2 ** min(int(now - failing_since), 5)))
            continue
        failing_since = None
        offset = after
        spool.mark_delivered(offset)
        idle_since = time.monotonic()
        pause = 0.005


def run_deliverer(spool: Spool, body: Callable[[], bool]) -> bool:
    """Run ``body`` as this spool's one deliverer, then hand over: after the lock is released,
    lines that came in meanwhile (whose hook saw the lock still held) are delivered by running
    again, unless ``body`` gave up on the destination. Returns False when another deliverer
    held the spool."""
    ran = False
    while True:
        with spool.delivering() as mine:
            if not mine:
                return ran
            ran = True
            caught_up = body()
            offset = spool.delivered()
        if not caught_up or spool.size() <= offset:
            return True
