"""A process that forks after it has emitted keeps emitting in the child: parent and child each
write through their own database connection, never through the one the parent opened.

A pooled connection copied by ``fork`` is one socket (or one SQLite handle) used by two
processes: on PostgreSQL their messages interleave on the wire (protocol errors, "lost
synchronization with server", one process reading the other's answers) and the child's exit
closes the parent's session. So the parent and the child write at the same time, several
rounds, the child closes its telemetry before it exits, and every warning either side logs is
a failure — a retry that hid the collision still counts.
"""

import json
import logging
import os
from typing import Any

import pytest

import maitred
from maitred.middleware import EmitterSettings
from maitred.storage import SessionStore
from tests.helpers import Warnings, assert_nothing_lost_across_fork, child_report, emit_calls

#: Rounds of writing at the same time in parent and child, and tool calls per round and side.
ROUNDS = 5
CALLS = 300


def write_rounds(side: str, start_r: int, ready_w: int) -> dict[str, Any]:
    """Wait for the other side, then emit and flush ``ROUNDS`` times; what happened, as figures."""
    emitted, flushed = 0, []
    for r in range(ROUNDS):
        os.write(ready_w, b".")  # both sides start each round together
        assert os.read(start_r, 1) == b"."
        emitted += emit_calls(f"{side}-{r}", CALLS)
        flushed.append(maitred.flush(timeout=30))
    (stats,) = maitred.stats()
    return {
        "emitted": emitted,
        "flushed": flushed,
        "delivered": stats.delivered,
        "dropped": stats.dropped,
        "last_error": stats.last_error,
    }


def child(start_r: int, ready_w: int, report_w: int) -> None:
    """The forked child: write alongside the parent, close telemetry as an exiting process
    does, report, and leave without running the parent's test machinery."""
    code = 1
    try:
        warnings = Warnings()
        logging.getLogger("maitred").addHandler(warnings)
        figures = write_rounds("child", start_r, ready_w)
        figures["shutdown"] = maitred.shutdown(timeout=30)
        figures["warnings"] = warnings.messages
        os.write(report_w, json.dumps(figures).encode())
        code = 0
    finally:
        os._exit(code)


@pytest.mark.timeout(120)  # a guard against a hung child, not a speed requirement
def test_a_forked_child_and_its_parent_each_store_every_event_once(db_url):
    maitred.configure(db_url=db_url, settings=EmitterSettings(interval_s=0.01, max_backoff_s=0.2))
    warnings = Warnings()
    logging.getLogger("maitred").addHandler(warnings)
    try:
        emitted = emit_calls("parent-before", CALLS)
        assert maitred.flush(timeout=30) is True  # the parent's store is open, its connection pooled
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child(to_child_r, to_parent_w, report_w)
        os.close(report_w)
        figures = write_rounds("parent", to_parent_r, to_child_w)
        in_child = child_report(pid, report_r)
        emitted += figures["emitted"] + emit_calls("parent-after", CALLS)
        assert maitred.flush(timeout=30) is True
        (stats,) = maitred.stats()
    finally:
        logging.getLogger("maitred").removeHandler(warnings)
        maitred.shutdown(timeout=30)
    assert_nothing_lost_across_fork(in_child, warnings.messages, stats, emitted)
    assert in_child["flushed"] == [True] * ROUNDS and in_child["shutdown"] is True
    assert figures["flushed"] == [True] * ROUNDS
    with SessionStore(db_url) as store:
        assert store.check_integrity() == []
        stored = {
            program_id: len(store.events(program_id))
            for program_id in ["parent-before", "parent-after"]
            + [f"{side}-{r}" for side in ("parent", "child") for r in range(ROUNDS)]
        }
        assert store.tool_stats().n == (2 + 2 * ROUNDS) * CALLS  # every call once, start and end joined
    assert stored == dict.fromkeys(stored, 2 * CALLS + 2)
