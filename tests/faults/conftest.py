"""Fresh databases for the store's fault tests: each call of ``fresh_db()`` gives a new, empty
database on the test's backend (a new SQLite file, or a new PostgreSQL schema dropped after the
test), because a kill test needs a first write per run."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL
from tests.helpers import throwaway_schemas


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], str]]:
    if request.param == "sqlite":
        made = iter(range(10**6))
        yield lambda: f"sqlite:///{tmp_path / f'fresh-{next(made)}.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "f") as make:
        yield make
