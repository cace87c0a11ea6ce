"""Shared fixtures: a store URL on each real database, and a clean telemetry configuration.

Storage tests take ``db_url``, parametrised over SQLite (a file in tmp_path) and PostgreSQL
(``MAITRED_TEST_POSTGRES_URL``, one throwaway schema per test so tests never see each other's
rows). CI exports the PostgreSQL URL; without it the PostgreSQL cases skip, saying why.
"""

import os
from collections.abc import Iterator

import pytest

import maitred
from maitred.middleware import config
from tests.helpers import throwaway_schemas

POSTGRES_URL = os.environ.get("MAITRED_TEST_POSTGRES_URL")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'maitred.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL) as make:
        yield make()


@pytest.fixture
def telemetry(tmp_path) -> Iterator[str]:
    """Point the middleware at a fresh SQLite store; shut it down after the test."""
    url = f"sqlite:///{tmp_path / 'telemetry.db'}"
    maitred.configure(db_url=url)
    yield url
    maitred.shutdown(timeout=5)


@pytest.fixture(autouse=True)
def _no_leaked_configuration() -> Iterator[None]:
    yield
    if config._emitters is not None:
        maitred.shutdown(timeout=5)
