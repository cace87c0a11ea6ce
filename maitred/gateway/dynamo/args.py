"""The component's command line: ``python -m maitred.gateway.dynamo --endpoint ... --model-name ...``.

Flags follow ``dynamo.thunderagent_router`` where they mean the same (``--endpoint``,
``--model-name``, ``--model-path``, ``--router-block-size``) and ``maitred serve`` for the
policy's own (``--policy``, ``--hold-timeout``, ``--tick``, ``--priority``). The transport
flags default to Dynamo's environment variables, as Dynamo's own components do. A refused
value exits with status 2 and a message naming the flag.
"""

import argparse
import os
import re
from dataclasses import dataclass

from maitred.flags import positive, whole
from maitred.runtime.policies import POLICIES

#: ``dyn://namespace.component.endpoint`` (the scheme optional), Dynamo's endpoint path.
ENDPOINT_RE = re.compile(r"(?:dyn://)?([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)")
#: The component this router serves under (``{namespace}.maitred_router.generate``).
COMPONENT = "maitred_router"


def endpoint(text: str) -> str:
    """``namespace.component.endpoint`` from ``dyn://namespace.component.endpoint``."""
    match = ENDPOINT_RE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected dyn://namespace.component.endpoint, got {text!r}")
    return ".".join(match.groups())


def name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        raise argparse.ArgumentTypeError(f"expected letters, digits, '_' or '-', got {text!r}")
    return text


@dataclass(frozen=True)
class RouterArgs:
    endpoint: str  # the workers' endpoint, namespace.component.endpoint
    model_name: str
    model_path: str
    component: str = COMPONENT
    router_block_size: int | None = None  # None: the workers' cards say
    policy: str = "maitred"
    hold_timeout_s: float | None = None
    tick_s: float | None = None
    poll_s: float = 1.0
    priority: bool = False
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    min_workers: int = 1
    wait_for_workers_s: float = 60.0
    discovery_backend: str = "etcd"
    request_plane: str = "tcp"
    event_plane: str | None = None

    @property
    def namespace(self) -> str:
        return self.endpoint.split(".", 1)[0]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m maitred.gateway.dynamo",
        description="maitred's runtime policy as a Dynamo router component: admission and holding before each "
        "turn, the worker each program is pinned to, usage fed back (see maitred/gateway/dynamo/__init__.py)",
    )
    p.add_argument("--endpoint", type=endpoint, required=True, help="the workers' endpoint, dyn://namespace.component.endpoint")
    p.add_argument("--model-name", type=str, required=True, help="the model name this router registers with the frontend")
    p.add_argument("--model-path", help="tokenizer and model card folder for the registration (default: --model-name)")
    p.add_argument("--component", type=name, default=COMPONENT, help=f"this router's component name (default: {COMPONENT})")
    p.add_argument("--router-block-size", type=whole(1), help="KV block size of the workers (default: what their cards say)")
    p.add_argument("--policy", choices=list(POLICIES), default="maitred", help="maitred's policy (default: maitred)")
    p.add_argument("--hold-timeout", type=positive("number of seconds"), help="bounded wait of a held request, s")
    p.add_argument("--tick", type=positive("number of seconds"), help="scheduler period, s (default: the policy's)")
    p.add_argument(
        "--poll", type=positive("number of seconds"), default=1.0, help="worker health and load polling, s (default: 1)"
    )
    p.add_argument(
        "--priority",
        action="store_true",
        help="send the core's eviction priority as routing.priority (read by Dynamo's SGLang worker; "
        "launch SGLang with --radix-eviction-policy priority)",
    )
    p.add_argument(
        "--http-host", default="127.0.0.1", help="address of the events/programs/metrics HTTP port (default: 127.0.0.1)"
    )
    p.add_argument(
        "--http-port",
        type=whole(0, 65535),
        help="serve maitred's POST /v1/events, GET /v1/programs, /metrics and /healthz here (default: off)",
    )
    p.add_argument("--min-workers", type=whole(1), default=1, help="workers to wait for at start (default: 1)")
    p.add_argument(
        "--wait-for-workers",
        type=positive("number of seconds"),
        default=60.0,
        help="how long to wait for --min-workers at start, s (default: 60)",
    )
    p.add_argument(
        "--discovery-backend",
        choices=("etcd", "file", "mem", "kubernetes"),
        default=os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
        help="Dynamo discovery (default: $DYN_DISCOVERY_BACKEND or etcd)",
    )
    p.add_argument(
        "--request-plane",
        choices=("tcp", "nats"),
        default=os.environ.get("DYN_REQUEST_PLANE", "tcp"),
        help="Dynamo request plane (default: $DYN_REQUEST_PLANE or tcp)",
    )
    p.add_argument(
        "--event-plane",
        choices=("zmq", "nats"),
        default=os.environ.get("DYN_EVENT_PLANE") or None,
        help="Dynamo event plane (default: $DYN_EVENT_PLANE, else Dynamo's)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> RouterArgs:
    p = parser()
    a = p.parse_args(argv)
    model_path = a.model_path or a.model_name
    if a.model_path is not None and not os.path.exists(a.model_path):
        p.error(f"argument --model-path: {a.model_path!r} does not exist")
    return RouterArgs(
        endpoint=a.endpoint,
        model_name=a.model_name,
        model_path=model_path,
        component=a.component,
        router_block_size=a.router_block_size,
        policy=a.policy,
        hold_timeout_s=a.hold_timeout,
        tick_s=a.tick,
        poll_s=a.poll,
        priority=a.priority,
        http_host=a.http_host,
        http_port=a.http_port,
        min_workers=a.min_workers,
        wait_for_workers_s=a.wait_for_workers,
        discovery_backend=a.discovery_backend,
        request_plane=a.request_plane,
        event_plane=a.event_plane,
    )
