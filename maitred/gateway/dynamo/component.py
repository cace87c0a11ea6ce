"""Wiring the component: Dynamo's runtime, the KV router, the live driver, the endpoints.

``run`` connects to Dynamo (discovery, request and event planes as the flags say), waits for
the worker endpoint's instances, builds a ``KvRouter`` on it (block size from the workers'
cards unless given), starts a ``LiveDriver`` whose workers are those instances
(``fleet.DynamoWorker``; instances that appear later are added, those that vanish are declared
down by the driver's polling), registers ``--model-name`` with the frontend on
``{namespace}.{component}.generate`` and serves it, with ``status``. With ``--http-port``,
maitred's own HTTP surface runs beside it on the same event loop: ``POST /v1/events`` (the
middleware's tool events), ``GET /v1/programs``, ``GET /metrics``, ``GET /healthz``.
"""

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from typing import Any

from maitred.gateway.dynamo.args import RouterArgs
from maitred.gateway.dynamo.fleet import DynamoWorker, Fleet
from maitred.gateway.dynamo.handler import MaitredHandler
from maitred.gateway.live_config import LiveConfig
from maitred.gateway.loop import LiveDriver

log = logging.getLogger("maitred.service")
#: How often the instances serving the worker endpoint are looked at for new ones, s.
DISCOVERY_POLL_S = 1.0


class StartError(RuntimeError):
    """The component cannot start (no workers, no card to read the block size from)."""


def live_config(args: RouterArgs) -> LiveConfig:
    """The driver's settings; warmups stay off (there is no prefill-only request through Dynamo's
    KV router that the component could send, see the package docstring)."""
    return LiveConfig(
        policy=args.policy,
        tick_s=args.tick_s,
        hold_timeout_s=args.hold_timeout_s,
        poll_s=args.poll_s,
        priority=args.priority,
        warmups=False,
    )


async def _wait_for(what: str, ready: Any, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not ready():
        if loop.time() >= deadline:
            raise StartError(what)
        await asyncio.sleep(0.2)


def _add_new(driver: LiveDriver, fleet: Fleet) -> None:
    for iid in sorted(fleet.instance_ids()):
        if str(iid) not in driver.backends:
            log.info("maitred: Dynamo worker instance %d discovered", iid)
            driver.add_worker(str(iid), DynamoWorker(fleet, iid))
            driver.kick()


async def _discover(driver: LiveDriver, fleet: Fleet) -> None:
    while True:
        await asyncio.sleep(DISCOVERY_POLL_S)
        try:
            _add_new(driver, fleet)
        except Exception:
            log.exception("maitred: Dynamo discovery poll failed")


def admin_app(driver: LiveDriver, host: str) -> Any:
    """maitred's ingest and introspection routes on the component's driver (no proxy routes:
    model requests come through Dynamo)."""
    from maitred.gateway.front import GatewayApp
    from maitred.gateway.ingest import add_admin_routes
    from maitred.gateway.origin import LOOPBACK_HOSTS, OriginGuard

    hosts = LOOPBACK_HOSTS if host in LOOPBACK_HOSTS else ("*",)
    app = GatewayApp(
        guards=[(OriginGuard, {"allowed_hosts": hosts})], title="maitred-dynamo", docs_url=None, redoc_url=None, openapi_url=None
    )
    add_admin_routes(app, driver, max_events_bytes=16 << 20)
    return app


def _http_server(driver: LiveDriver, host: str, port: int) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # the component handles SIGTERM and SIGINT itself
            yield

    return Server(uvicorn.Config(admin_app(driver, host), host=host, port=port, log_level="warning", lifespan="off"))


async def run(args: RouterArgs) -> None:
    from dynamo.llm import (
        FpmEventSubscriber,
        KvRouter,
        KvRouterConfig,
        ModelInput,
        ModelRuntimeConfig,
        ModelType,
        WorkerType,
        register_model,
    )
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    planes = {"event_plane": args.event_plane} if args.event_plane else {}
    runtime = DistributedRuntime(loop, args.discovery_backend, args.request_plane, **planes)
    workers = runtime.endpoint(args.endpoint)
    client = await workers.client()
    cards = FpmEventSubscriber(workers)
    cards.start_tracking()
    fleet = Fleet(client, cards, router=None)
    tasks: list[asyncio.Future[Any]] = []
    driver: LiveDriver | None = None
    try:
        await _wait_for(
            f"--min-workers: fewer than {args.min_workers} instances serve {args.endpoint} after {args.wait_for_workers_s:g} s",
            lambda: len(fleet.instance_ids()) >= args.min_workers,
            args.wait_for_workers_s,
        )
        block_size = args.router_block_size
        if block_size is None:
            await _wait_for(
                f"no worker card says its kv_cache_block_size after {args.wait_for_workers_s:g} s; give --router-block-size",
                lambda: fleet.block_size() is not None,
                args.wait_for_workers_s,
            )
            block_size = fleet.block_size()
        router = KvRouter(endpoint=workers, block_size=block_size, kv_router_config=KvRouterConfig())
        fleet.router = router
        driver = LiveDriver({}, live_config(args))
        _add_new(driver, fleet)
        await driver.start(wait_for_workers_s=args.wait_for_workers_s)
        tasks.append(asyncio.create_task(_discover(driver, fleet)))
        handler = MaitredHandler(driver, router, priority=args.priority, instance_ids=fleet.instance_ids)

        async def status(request: Any = None, context: Any = None) -> Any:
            yield handler.status()

        generate = runtime.endpoint(f"{args.namespace}.{args.component}.generate")
        status_endpoint = runtime.endpoint(f"{args.namespace}.{args.component}.status")
        await register_model(
            model_input=ModelInput.Tokens,
            model_type=ModelType.Chat | ModelType.Completions,
            endpoint=generate,
            model_path=args.model_path,
            model_name=args.model_name,
            runtime_config=ModelRuntimeConfig(),
            worker_type=WorkerType.Aggregated,
        )
        labels = [("service", args.component)]
        tasks.append(
            asyncio.ensure_future(generate.serve_endpoint(handler.generate, graceful_shutdown=True, metrics_labels=labels))
        )
        tasks.append(asyncio.ensure_future(status_endpoint.serve_endpoint(status, graceful_shutdown=True, metrics_labels=labels)))
        server = None
        if args.http_port is not None:
            server = _http_server(driver, args.http_host, args.http_port)
            tasks.append(asyncio.create_task(server.serve()))
        log.info(
            "maitred: Dynamo router %s.%s.generate serving %r over %s (policy %s, %d workers, block size %d%s)",
            args.namespace,
            args.component,
            args.model_name,
            args.endpoint,
            args.policy,
            len(driver.backends),
            block_size,
            f", maitred HTTP on {args.http_host}:{args.http_port}" if server is not None else "",
        )
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopping and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if server is not None:
            server.should_exit = True
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if driver is not None:
            await driver.stop()
        with contextlib.suppress(Exception):
            cards.shutdown()
        runtime.shutdown()


#: What to install where Dynamo is missing (``ai-dynamo`` itself goes without its dependencies:
#: one of them downloads from outside the package registries).
INSTALL_HINT = "pip install 'maitred[dynamo]' && pip install --no-deps ai-dynamo==1.6.1"


def main(argv: list[str] | None = None) -> int:
    import importlib.util

    from maitred.gateway.dynamo.args import parse_args

    args = parse_args(argv)  # bad flags are refused before Dynamo is looked for
    if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
        print(f"maitred: Dynamo is not installed ({INSTALL_HINT})", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        uvloop.run(run(args))
    except StartError as exc:
        print(f"maitred: {exc}", file=sys.stderr)
        return 2
    return 0
