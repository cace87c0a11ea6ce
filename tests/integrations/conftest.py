"""A maitred gateway on simulated workers, all real servers on 127.0.0.1, for the end-to-end tests."""

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from maitred.harness.local import LocalCluster, local_cluster

# The Claude Code harness's checks are plain asserts in a helper module: show their values too.
pytest.register_assert_rewrite("tests.integrations.claude_cli")


class Cluster:
    """A running ``local_cluster`` and the runtime's view of one program."""

    def __init__(self, running: LocalCluster) -> None:
        self.url = running.gateway_url
        self.worker_urls = running.worker_urls
        self.db_url = running.db_url or ""

    def program(self, program_id: str) -> dict[str, Any] | None:
        response = httpx.get(f"{self.url}/v1/programs/{program_id}", timeout=10)
        return response.json() if response.status_code == 200 else None


@pytest.fixture
def cluster(tmp_path) -> Iterator[Callable[..., Cluster]]:
    """``cluster(workers=2, script_tools=True)``: sim-workers and a gateway in front, persisting to a fresh store."""
    with ExitStack() as stack:

        def make(*, workers: int = 2, script_tools: bool = True) -> Cluster:
            running = local_cluster(
                workers=workers, script_tools=script_tools, db_url=f"sqlite:///{tmp_path / 'gateway.db'}", time_scale=50.0
            )
            return Cluster(stack.enter_context(running))

        yield make
