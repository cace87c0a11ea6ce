"""A maitred gateway on simulated workers, served in this process: what the integration examples
and benchmarks run against when no ``maitred serve`` is given (``--gateway URL``).

The workers are ``maitred sim-worker`` doubles (SGLang's API, the simulator's timing, filler
text, and with ``script_tools`` deterministic tool calls so agent loops run), never a model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maitred.sim.worker.session_script import SessionScript

__all__ = ["LocalCluster", "local_cluster"]


@dataclass(frozen=True)
class LocalCluster:
    gateway_url: str
    worker_urls: list[str]
    db_url: str | None


@contextmanager
def local_cluster(
    *,
    workers: int = 2,
    script_tools: bool = True,
    db_url: str | None = None,
    gpu_tokens: int = 200_000,
    worker_ports: list[int] | None = None,
    time_scale: float = 20.0,
    overcommit_headroom: float | None = None,
    script: SessionScript | None = None,
) -> Iterator[LocalCluster]:
    """Start ``workers`` simulated workers and a gateway in front of them (background threads,
    real sockets on 127.0.0.1); stop them on exit. ``db_url``: where the gateway persists events.
    ``overcommit_headroom``: the gateway's (``maitred serve --overcommit-headroom``), else its default.
    ``script``: the workers answer scripted sessions (``maitred sim-worker --script``)."""
    from maitred.gateway.app import ServeConfig, build_app
    from maitred.gateway.loop import LiveConfig
    from maitred.harness.background import BackgroundServer
    from maitred.sim.worker.app import create_app
    from maitred.sim.worker.config import SimWorkerConfig

    ports = worker_ports or [0] * workers
    runtime = LiveConfig(tick_s=0.2, poll_s=0.5)
    if overcommit_headroom is not None:
        runtime = replace(runtime, overcommit_headroom=overcommit_headroom)
    with ExitStack() as stack:
        sims = [
            stack.enter_context(
                BackgroundServer(
                    create_app(
                        SimWorkerConfig(gpu_tokens=gpu_tokens, time_scale=time_scale, script_tools=script_tools, script=script)
                    ),
                    port=port,
                )
            )
            for port in ports
        ]
        gateway = build_app(ServeConfig([s.url for s in sims], db_url=db_url, wait_for_workers_s=10, runtime=runtime))
        server = stack.enter_context(BackgroundServer(gateway.app))
        yield LocalCluster(server.url, [s.url for s in sims], db_url)
