"""``sharded``: two maitred shards behind HAProxy or nginx (parametrised over both), every
process real and on 127.0.0.1, all stopped at the end of the test (``tests/scale/harness.py``);
``warnings``: what maitred's emitter warned of during the test; ``schema_url``: fresh schemas
of the test PostgreSQL for the shards that keep their state there."""

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from tests.conftest import POSTGRES_URL
from tests.helpers import Warnings, throwaway_schemas
from tests.scale.harness import BALANCERS, Sharded, require_balancer, start_sharded

SHARDS = 2


@pytest.fixture(params=BALANCERS)
def sharded(request: pytest.FixtureRequest, tmp_path) -> Iterator[Sharded]:
    require_balancer(request.param)
    with ExitStack() as stack:
        yield start_sharded(request.param, SHARDS, tmp_path, stack)


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The warnings the emitter gives (a refused or failed event POST is one)."""
    handler = Warnings()
    logging.getLogger("maitred").addHandler(handler)
    yield handler.messages
    logging.getLogger("maitred").removeHandler(handler)


@pytest.fixture
def schema_url() -> Iterator[Callable[[], str]]:
    """A maker of store URLs, each on a fresh schema of the test PostgreSQL."""
    if not POSTGRES_URL:
        pytest.skip("MAITRED_TEST_POSTGRES_URL is not set (CI sets it)")
    with throwaway_schemas(POSTGRES_URL, "scale") as make:
        yield make
