"""A maitred gateway on simulated workers, all real servers on 127.0.0.1, for the end-to-end tests."""

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from maitred.runtime.service.app import Gateway, ServeConfig, build_app
from maitred.runtime.service.background import BackgroundServer
from maitred.runtime.service.loop import RuntimeConfig
from maitred.runtime.service.simworker import SimWorkerConfig, create_app

FAST = RuntimeConfig(tick_s=0.2, poll_s=0.2, hold_timeout_s=30.0)


@dataclass
class Cluster:
    workers: list[BackgroundServer]
    gateway: Gateway
    server: BackgroundServer
    db_url: str

    @property
    def url(self) -> str:
        return self.server.url

    def program(self, program_id: str) -> dict[str, Any] | None:
        response = httpx.get(f"{self.url}/v1/programs/{program_id}", timeout=10)
        return response.json() if response.status_code == 200 else None


@pytest.fixture
def cluster(tmp_path) -> Iterator[Callable[..., Cluster]]:
    """``cluster(workers=2, gpu_tokens=..., script_tools=True)``: sim-workers and a gateway in front."""
    with ExitStack() as stack:
        def make(*, workers: int = 2, gpu_tokens: int = 200_000, script_tools: bool = True, runtime: RuntimeConfig = FAST) -> Cluster:
            sims = [stack.enter_context(BackgroundServer(create_app(SimWorkerConfig(
                gpu_tokens=gpu_tokens, time_scale=50.0, script_tools=script_tools, script_steps=3)))) for _ in range(workers)]
            db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
            gateway = build_app(ServeConfig([s.url for s in sims], db_url=db_url, runtime=runtime, wait_for_workers_s=10))
            server = stack.enter_context(BackgroundServer(gateway.app))
            return Cluster(sims, gateway, server, db_url)
        yield make
