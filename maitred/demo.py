"""``maitred demo``: a small instrumented multi-agent workload, recorded into SQLite.

Six programs run at once, each a planner that hands off to a coder; every step is a (simulated)
model call followed by real decorated tool functions that sleep for realistic, skewed
durations — most under a few tens of milliseconds, a few long test runs — so the statistics
table printed at the end has the heavy tail that agent tool calls show in practice.
"""

import random
import sqlite3
import threading
import time
from contextvars import copy_context
from pathlib import Path

import maitred

TIME_SCALE = 0.05  # demo seconds per real-agent second, so the demo finishes in seconds


@maitred.tool(signature="grep")
def grep(pattern: str, rng: random.Random) -> int:
    time.sleep(rng.lognormvariate(-1.5, 0.5) * TIME_SCALE)
    return len(pattern)


@maitred.tool
def read_file(path: str, rng: random.Random) -> str:
    time.sleep(rng.lognormvariate(-2.0, 0.4) * TIME_SCALE)
    return path


@maitred.tool(name="bash", deadline_arg="timeout", deadline_unit="ms")
def bash(command: str, rng: random.Random, timeout: int = 120_000) -> str:
    time.sleep(rng.lognormvariate(0.5, 1.0) * TIME_SCALE)
    return command


@maitred.tool(timeout=600)
def pytest(rng: random.Random) -> str:
    time.sleep(rng.uniform(10, 30) * TIME_SCALE)
    return "passed"


def _step(rng: random.Random, context: int) -> int:
    with maitred.llm_call(model="demo-7b", prompt_tokens=context) as call:
        time.sleep(rng.uniform(0.5, 2.0) * TIME_SCALE)
        out = rng.randint(40, 200)
        call.finish(completion_tokens=out, cached_tokens=int(context * 0.9))
    return context + out + rng.randint(200, 1500)


def _agent_program(index: int, seed: int) -> None:
    rng = random.Random(seed * 1000 + index)
    context = 2000
    with maitred.program(f"demo-{index}", agent="planner", framework="demo"):
        for _ in range(rng.randint(2, 4)):
            context = _step(rng, context)
            grep("def main", rng)
            read_file("src/app.py", rng)
        maitred.handoff("coder", messages=[{"role": "user", "content": f"implement task {index}"}], context_tokens=context)
        with maitred.agent("coder"):
            for _ in range(rng.randint(3, 6)):
                context = _step(rng, context)
                bash("ls -la", rng, timeout=30_000)
                if rng.random() < 0.3:
                    pytest(rng)


def run_demo(db_url: str, *, programs: int = 6, seed: int = 0) -> None:
    """Run the workload into ``db_url`` and wait until every event is stored."""
    maitred.configure(db_url=db_url)
    threads = [
        threading.Thread(target=copy_context().run, args=(_agent_program, i, seed), name=f"demo-{i}") for i in range(programs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not maitred.flush(timeout=30):
        raise RuntimeError(f"demo events were not all stored: {maitred.stats()}")


# SQLite's header field for "which application owns this file" (bytes 68-71, big-endian); the demo
# stamps its databases with it so that ``--db-file`` can never delete a history it did not make.
DEMO_APPLICATION_ID = int.from_bytes(b"mdmo", "big")
_SQLITE_MAGIC = b"SQLite format 3\x00"


class NotADemoDatabase(Exception):
    """The file exists and was not made by ``maitred demo``, so it must not be replaced."""


def is_demo_database(path: Path) -> bool:
    """True if ``path`` is a SQLite file stamped by the demo. Reads the header bytes only: it
    never opens, creates or modifies the file."""
    try:
        with path.open("rb") as f:
            header = f.read(72)
    except OSError:
        return False
    return len(header) == 72 and header.startswith(_SQLITE_MAGIC) and int.from_bytes(header[68:72], "big") == DEMO_APPLICATION_ID


def check_demo_target(path: Path) -> None:
    """Refuse a ``--db-file`` that holds anything but an earlier demo database; a missing file is fine."""
    if (path.exists() or path.is_symlink()) and not is_demo_database(path):
        raise NotADemoDatabase(
            f"{path} exists and is not a maitred demo database; refusing to overwrite it "
            "(choose another --db-file, or delete it yourself)"
        )


def fresh_sqlite(path: Path) -> str:
    """Recreate ``path`` as an empty, demo-stamped SQLite file and return its URL.

    Raises ``NotADemoDatabase`` (deleting nothing) if the file exists and is not the demo's. The
    stamp is written before any event, so a demo that dies half-way can still be rerun."""
    check_demo_target(path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA application_id = {DEMO_APPLICATION_ID}")
        conn.commit()
    finally:
        conn.close()
    return f"sqlite:///{path}"
