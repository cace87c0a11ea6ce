"""``sharded``: two maitred shards behind HAProxy or nginx (parametrised over both), every
process real and on 127.0.0.1, all stopped at the end of the test (``tests/scale/harness.py``)."""

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from tests.scale.harness import BALANCERS, Balancer, Shard, require_balancer, start_balancer, start_shards

SHARDS = 2


@dataclass
class Sharded:
    balancer: Balancer
    shards: list[Shard]

    def placement(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Each program's ``(tool_calls, llm_calls)`` in the store of every shard that has it."""
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for shard in self.shards:
            for pid, summary in shard.programs().items():
                out.setdefault(pid, {})[shard.name] = (summary.tool_calls, summary.llm_calls)
        return out


@pytest.fixture(params=BALANCERS)
def sharded(request: pytest.FixtureRequest, tmp_path) -> Iterator[Sharded]:
    require_balancer(request.param)
    with ExitStack() as stack:
        shards = start_shards(SHARDS, tmp_path, stack)
        yield Sharded(start_balancer(request.param, shards, tmp_path, stack), shards)
