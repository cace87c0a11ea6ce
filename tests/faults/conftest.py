"""Fresh databases for the store's fault tests: each call of ``fresh_db()`` gives a new, empty
database on the test's backend (a new SQLite file, or a new PostgreSQL schema dropped after the
test), because a kill test needs a first write per run."""

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    if request.param == "sqlite":
        made = iter(range(10**6))
        yield lambda: f"sqlite:///{tmp_path / f'fresh-{next(made)}.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    admin = create_engine(POSTGRES_URL)
    schemas: list[str] = []

    def make() -> str:
        schema = f"f_{uuid.uuid4().hex[:12]}"
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        schemas.append(schema)
        sep = "&" if "?" in POSTGRES_URL else "?"
        return f"{POSTGRES_URL}{sep}options={quote(f'-csearch_path={schema}')}"

    try:
        yield make
    finally:
        with admin.begin() as conn:
            for schema in schemas:
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
