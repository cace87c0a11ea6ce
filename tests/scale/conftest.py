"""``sharded``: two maitred shards behind HAProxy or nginx (parametrised over both), every
process real and on 127.0.0.1, all stopped at the end of the test (``tests/scale/harness.py``)."""

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.scale.harness import BALANCERS, Sharded, require_balancer, start_sharded

SHARDS = 2


@pytest.fixture(params=BALANCERS)
def sharded(request: pytest.FixtureRequest, tmp_path) -> Iterator[Sharded]:
    require_balancer(request.param)
    with ExitStack() as stack:
        yield start_sharded(request.param, SHARDS, tmp_path, stack)
