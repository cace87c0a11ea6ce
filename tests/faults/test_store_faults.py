"""The store under broken surroundings: a closed or hanging PostgreSQL port, a full disk, a
read-only file. Each ends in one ``StoreError`` line naming the database, the write is whole or
absent (never half), and nothing stored before is lost."""

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import event

from maitred.storage import SessionStore, StoreUnavailable
from tests.faults.store_child import batch_events


def test_a_closed_postgresql_port_is_an_outage_naming_the_server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(StoreUnavailable, match=f"^database unavailable: postgresql\\+psycopg://maitred@127.0.0.1:{port}/db "):
        SessionStore(f"postgresql://maitred@127.0.0.1:{port}/db", connect_timeout_s=1)


@pytest.mark.timeout(60)  # a guard against hanging forever, not a speed requirement
def test_a_postgresql_port_that_never_answers_times_out_instead_of_hanging():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
        port = silent.getsockname()[1]
        with pytest.raises(StoreUnavailable, match=f"^database unavailable: .*127.0.0.1:{port}/db .*timeout"):
            SessionStore(f"postgresql://maitred@127.0.0.1:{port}/db", connect_timeout_s=1)


def test_a_database_at_its_size_limit_refuses_the_whole_batch_as_an_outage(tmp_path):
    url = f"sqlite:///{tmp_path / 'full.db'}"
    with SessionStore(url) as store:
        assert store.write(batch_events("w", 0, 200)).stored == 200
        with store.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
    with SessionStore(url) as store:
        event.listen(store.engine, "connect", lambda dbapi, _: dbapi.execute(f"PRAGMA max_page_count={pages + 2}"))
        store.engine.dispose()  # new connections, with the limit
        big = batch_events("w", 1, 5000)
        with pytest.raises(StoreUnavailable, match=f"^database or disk is full: {tmp_path / 'full.db'}$"):
            store.write(big)
        assert len(store.events()) == 200  # nothing of the refused batch, nothing lost before it
        assert store.check_integrity() == []
    with SessionStore(url) as store:  # room again: the kept batch goes in whole
        assert store.write(big).stored == 5000
        assert len(store.events()) == 5200


@contextmanager
def tiny_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root); the size-limited database case covers SQLITE_FULL")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_filesystem_is_an_outage_and_the_retry_after_freeing_space_stores_all(tmp_path):
    with tiny_tmpfs(tmp_path / "small", "512k") as disk:
        url = f"sqlite:///{disk / 'full.db'}"
        stored = 0
        with SessionStore(url) as store:
            with pytest.raises(StoreUnavailable, match=f"^database (or disk is full|unavailable): {disk / 'full.db'}"):
                for batch in range(1000):
                    stored += store.write(batch_events("w", batch, 400)).stored
            failed = batch
            assert stored > 0 and len(store.events()) == stored
        subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        with SessionStore(url) as store:
            assert store.check_integrity() == []
            assert store.write(batch_events("w", failed, 400)).stored == 400
            assert len(store.events()) == stored + 400


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make ``path`` unwritable for this process: a mode bit for a normal user; root ignores
    those, so there the file is made immutable (chattr +i) when the filesystem allows it."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(0o644)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a filesystem without chattr +i: cannot make a file read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_database_reads_and_names_its_path_when_written(tmp_path):
    path = tmp_path / "ro.db"
    with SessionStore(str(path)) as store:
        store.write(batch_events("w", 0, 100))
    with read_only(path), SessionStore(str(path)) as store:
        assert len(store.events()) == 100
        with pytest.raises(StoreUnavailable, match=f"^database is read-only: {path} "):
            store.write(batch_events("w", 1, 100))
        assert len(store.events()) == 100


def test_a_database_in_a_missing_directory_is_named(tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "x.db"
    with pytest.raises(StoreUnavailable, match=f"^cannot open database: {path} \\(unable to open database file\\)$"):
        SessionStore(str(path))
    assert not (tmp_path / "no").exists()
