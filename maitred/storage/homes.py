"""Program homes on PostgreSQL: which shard serves each program, claimed as shards see them.

``claim`` makes this shard the home of programs it just saw and says, for each, which other
shard was its home before; ``moved_since`` lists the programs homed elsewhere whose home
changed since a time, for a shard that may have missed being told, and ``homed_elsewhere``
which of some programs another shard serves now, for a shard that restored them at start. Times are the database's
clock (seconds since the epoch), so shards on hosts whose clocks disagree still compare them.

Every function takes a connection in a transaction the caller commits: a notification sent in
the same transaction (``pg_notify``) reaches the listeners only if the claim is committed.
"""

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import Connection, func, select, update
from sqlalchemy.dialects import postgresql

from maitred.storage.models import Base

_HOMES = Base.metadata.tables["program_homes"]
#: The database's clock now, as seconds since the epoch (the clock moves within a transaction).
DB_NOW = func.extract("epoch", func.clock_timestamp())


@dataclass(frozen=True, slots=True)
class Move:
    """``program_id``'s home changed from shard ``src`` to shard ``dst`` at ``at`` (database clock)."""

    program_id: str
    src: str
    dst: str
    at: float


def claim(conn: Connection, shard: str, program_ids: Collection[str]) -> list[Move]:
    """Make ``shard`` the home of ``program_ids``; the moves this made (programs another shard
    was home to). A program already homed on ``shard`` is left as it is (no write).

    Rows already there are locked first (``FOR UPDATE``), so two shards claiming one program at
    once are serialised and the second sees the first's claim. Rows not there are inserted;
    one another shard inserted meanwhile (both saw a new program at once) conflicts, and the
    next round claims it from that shard like any other."""
    moves: list[Move] = []
    left = sorted(set(program_ids))  # a fixed order: two claims never lock rows crosswise
    while left:
        at = db_now(conn)
        homes = dict(
            conn.execute(
                select(_HOMES.c.program_id, _HOMES.c.shard)
                .where(_HOMES.c.program_id.in_(left))
                .order_by(_HOMES.c.program_id)
                .with_for_update()
            ).all()
        )
        elsewhere = [pid for pid in left if homes.get(pid, shard) != shard]
        if elsewhere:
            conn.execute(
                update(_HOMES).where(_HOMES.c.program_id.in_(elsewhere)).values(shard=shard, updated_at=at),
            )
            moves += [Move(pid, homes[pid], shard, at) for pid in elsewhere]
        new = [pid for pid in left if pid not in homes]
        if not new:
            break
        inserted = set(
            conn.execute(
                postgresql.insert(_HOMES)
                .values([{"program_id": pid, "shard": shard, "updated_at": at} for pid in new])
                .on_conflict_do_nothing(index_elements=["program_id"])
                .returning(_HOMES.c.program_id)
            ).scalars()
        )
        left = [pid for pid in new if pid not in inserted]
    return moves


def moved_since(conn: Connection, shard: str, since: float) -> list[str]:
    """Programs homed on another shard than ``shard`` whose home changed at or after ``since``:
    those of them ``shard`` still serves moved away from it."""
    query = select(_HOMES.c.program_id).where(_HOMES.c.shard != shard, _HOMES.c.updated_at >= since)
    return list(conn.execute(query).scalars())


def homed_elsewhere(conn: Connection, shard: str, program_ids: Collection[str]) -> list[str]:
    """Those of ``program_ids`` whose home is another shard than ``shard`` (a program no shard
    claimed yet is nobody else's)."""
    ids = sorted(set(program_ids))
    out: list[str] = []
    for i in range(0, len(ids), 1000):
        query = select(_HOMES.c.program_id).where(_HOMES.c.program_id.in_(ids[i : i + 1000]), _HOMES.c.shard != shard)
        out += conn.execute(query).scalars()
    return out


def db_now(conn: Connection) -> float:
    """The database's clock: what ``Move.at`` and ``moved_since`` measure time by."""
    return float(conn.execute(select(DB_NOW)).scalar_one())
