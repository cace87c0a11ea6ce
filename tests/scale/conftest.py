"""``sharded``: two maitred shards behind HAProxy or nginx (parametrised over both), every
process real and on 127.0.0.1, all stopped at the end of the test (``tests/scale/harness.py``);
``warnings``: what maitred's emitter warned of during the test."""

import logging
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.helpers import Warnings
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
