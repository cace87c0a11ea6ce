"""The hook spool (``maitred.integrations.spool``): order, nothing lost, one deliverer."""

import json
from pathlib import Path
from typing import Any

from maitred.integrations.spool import COMPACT_BYTES, Destination, Spool, deliver_forever, run_deliverer, spool_dir


def line(n: int) -> bytes:
    return json.dumps([{"n": n}]).encode()


def events_of(raw: bytes) -> list[dict[str, Any]]:
    value = json.loads(raw)
    if not isinstance(value, list):
        raise ValueError("not a list")
    return value


def test_lines_are_delivered_in_order_and_a_bad_one_is_skipped_and_named(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in range(3):
        spool.append(line(n))
    spool.append(b"{not json")
    spool.append(line(3))
    got: list[int] = []
    said: list[str] = []
    caught_up = deliver_forever(
        spool, events_of, lambda batch: got.extend(e["n"] for e in batch), said.append, linger_s=0, give_up_s=0
    )
    assert caught_up and got == [0, 1, 2, 3]
    assert len(said) == 1 and "skipped" in said[0] and str(spool.path) in said[0]
    assert spool.delivered() == spool.size()


def test_a_destination_that_is_down_keeps_every_line_for_the_next_deliverer(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(line(0))
    said: list[str] = []
    assert not deliver_forever(spool, events_of, lambda batch: "is unreachable", said.append, linger_s=0, give_up_s=0)
    assert spool.delivered() == 0 and "1 events kept" in said[0]
    got: list[int] = []
    assert deliver_forever(
        spool, events_of, lambda batch: got.extend(e["n"] for e in batch), said.append, linger_s=0, give_up_s=0
    )
    assert got == [0]


def test_a_line_appended_while_the_deliverer_hands_over_is_delivered(tmp_path: Path) -> None:
    """The hook appends, then looks for a deliverer; a deliverer about to exit releases its lock,
    then looks for lines: a line whose hook saw the lock still held is not left behind."""
    spool = Spool(tmp_path)
    spool.append(line(0))
    got: list[int] = []
    runs = []

    def body() -> bool:
        runs.append(spool.deliverer_running())  # held by this deliverer
        done = deliver_forever(spool, events_of, lambda b: got.extend(e["n"] for e in b), print, linger_s=0, give_up_s=0)
        if len(runs) == 1:
            spool.append(line(1))  # a hook that found the lock held, so started no deliverer
        return done

    assert run_deliverer(spool, body)
    assert got == [0, 1] and runs == [True, True]
    assert not spool.deliverer_running()


def test_a_second_deliverer_leaves_the_spool_to_the_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with spool.delivering() as mine:
        assert mine
        assert spool.deliverer_running()
        assert run_deliverer(Spool(tmp_path), lambda: True) is False


def test_a_delivered_spool_is_emptied_only_past_the_compaction_size(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    big = json.dumps([{"pad": "x" * 1000}]).encode()
    for _ in range(COMPACT_BYTES // len(big) + 2):
        spool.append(big)
    n = 0

    def count(batch: list[dict[str, Any]]) -> None:
        nonlocal n
        n += len(batch)

    assert deliver_forever(spool, events_of, count, print, linger_s=0, give_up_s=0)
    assert n == COMPACT_BYTES // len(big) + 2
    assert spool.size() == 0 and spool.delivered() == 0
    spool.append(line(7))  # appends after the truncation start from the top
    got: list[int] = []
    assert deliver_forever(spool, events_of, lambda b: got.extend(e["n"] for e in b), print, linger_s=0, give_up_s=0)
    assert got == [7]


def test_each_destination_has_its_own_spool(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MAITRED_SPOOL_DIR", str(tmp_path))
    a = spool_dir(Destination("http://127.0.0.1:8000", None, "t1"))
    assert a == spool_dir(Destination("http://127.0.0.1:8000", None, "t1"))
    assert a != spool_dir(Destination("http://127.0.0.1:8000", None, "t2"))
    assert a != spool_dir(Destination(None, "sqlite:///x.db"))
    assert a.parent == tmp_path and "t1" not in a.name  # the token is hashed, never in a path
