"""``maitred serve`` and ``maitred sglang-args``: flags and entry points.

Top-level imports stay light (the standard library only) so that ``maitred --help`` and the
other commands do not pay for FastAPI, uvicorn and the policy core; ``run`` imports them.
Every bad flag value is refused by argparse with the flag named, or by ``run`` with one line
``maitred serve: error: --flag: ...`` and exit status 2.
"""

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from maitred.bind import KEEP_ALIVE_S, check_bindable
from maitred.config_file import ConfigError, ConfigSpec, run_configured
from maitred.flags import bounded, port, positive, seconds, whole
from maitred.gateway.live_config import LEASE_POLL_S, PROGRAM_TTL_S, LiveConfig
from maitred.gateway.top_tools import MAX_TOOLS
from maitred.runtime.admission import HOLD_TIMEOUT_S
from maitred.runtime.records import SignalConfig

if TYPE_CHECKING:
    from maitred.gateway.app import ServeConfig
    from maitred.gateway.sglang.launch import SGLangLaunch
    from maitred.gateway.standby import ShardConfig

#: The names of ``maitred.runtime.policies.POLICIES`` (kept here so ``--help`` needs no import;
#: a test checks the two agree).
POLICY_NAMES = ("maitred", "mori", "tao", "thunderagent", "cache_aware", "round_robin")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: SIGTERM to exit: requests in flight get SHUTDOWN_TIMEOUT_S, then queued events DRAIN_TIMEOUT_S;
#: together under the 30 s a supervisor commonly waits before SIGKILL (Kubernetes'
#: terminationGracePeriodSeconds, systemd's TimeoutStopSec is 90 s).
SHUTDOWN_TIMEOUT_S = 15.0
DRAIN_TIMEOUT_S = 10.0
_MEGABYTES = positive("number of megabytes")
_SHARD = re.compile(r"[A-Za-z0-9._-]{1,32}")
#: Every flag also as ``MAITRED_<FLAG>`` and as a key of ``--config FILE`` (``maitred.config_file``).
CONFIG = ConfigSpec("serve", "MAITRED_", secret=frozenset({"token"}))


def _worker_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a worker base URL like http://127.0.0.1:30000")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} has a bad port") from None
    return text.rstrip("/")


def _shard_name(text: str) -> str:
    """``--shard``'s type: short and plain, as it goes into the lease key and the holder's name."""
    if not _SHARD.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard name: 1 to 32 letters, digits, '.', '_' or '-'")
    return text


def _megabytes(text: str) -> int:
    return int(_MEGABYTES(text) * (1 << 20))


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (1 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be above 1 (SGLang needs a host pool larger than the GPU pool)")
    return value


def _gpus(text: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    if not items or not all(t.isdigit() for t in items):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of GPU indices, e.g. 0,1")
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{text!r} names a GPU twice")
    return items


def add_sglang_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=_gpus, default="0", help="GPU indices, one SGLang server each (default: 0)")
    parser.add_argument("--sglang-host", default="127.0.0.1", help="address the SGLang servers bind (default: 127.0.0.1)")
    parser.add_argument(
        "--sglang-base-port",
        type=port,
        default=30000,
        help="port of the first SGLang server; the next GPUs take the next ports (default: 30000)",
    )
    parser.add_argument(
        "--hicache-ratio", type=_ratio, default=2.0, help="host KV pool as a multiple of the GPU pool (default: 2)"
    )
    parser.add_argument(
        "--sglang-python", default=sys.executable, help="Python interpreter that has sglang installed (default: this one)"
    )
    parser.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for every SGLang server, e.g. --sglang-arg=--tp-size=2 (repeatable)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``maitred serve`` (SPEC 11, plus the runtime's knobs)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; others need --token)")
    parser.add_argument("--port", type=port, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument(
        "--worker",
        type=_worker_url,
        action="append",
        default=[],
        metavar="URL",
        help="base URL of an SGLang server (repeatable; none: telemetry only, no model routes)",
    )
    parser.add_argument(
        "--worker-urls",
        dest="worker",
        type=_worker_url,
        nargs="+",
        action="extend",
        metavar="URL",
        help="base URLs of SGLang servers, space-separated, as sglang-router spells it (the same list as --worker)",
    )
    parser.add_argument("--policy", choices=POLICY_NAMES, default="maitred", help="scheduling policy (default: maitred)")
    parser.add_argument(
        "--db", default=None, help="session store URL or SQLite path (default: $MAITRED_DB or sqlite:///maitred.db)"
    )
    parser.add_argument("--no-db", action="store_true", help="keep no history (events only update the live state)")
    parser.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        type=_otlp_url,
        default=None,
        help="also export the events it stores as OpenTelemetry GenAI spans over OTLP/HTTP to URL (a base URL "
        "such as http://127.0.0.1:6006, or .../v1/traces; needs the otel extra; default: $MAITRED_OTLP_ENDPOINT)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="token (16 characters or more) every endpoint but /metrics and /healthz then needs, model routes "
        "included (default: $MAITRED_TOKEN; none: loopback only, trusting local users)",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        default=None,
        help="more tokens, one a line: 'TOKEN' (every program) or 'TOKEN PREFIX ...' (only programs whose id "
        "starts with a PREFIX); # starts a comment",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name the gateway answers to (repeatable; '*': any; default: the bound address, plus "
        "localhost, 127.0.0.1 and ::1 on loopback; any when bound elsewhere, where a token is required)",
    )
    parser.add_argument(
        "--forward-unknown-fields",
        action="store_true",
        help="forward body fields off each model route's allow-list to the workers (default: drop them and "
        "name them in the x-maitred-dropped-fields header); priority and rid are refused either way",
    )
    parser.add_argument(
        "--tick",
        type=seconds,
        default=None,
        help="scheduler period in seconds (default: the policy's, as its authors run it: 1 s for "
        "maitred, tao, cache_aware and round_robin, 5 s for thunderagent and mori)",
    )
    parser.add_argument(
        "--hold-timeout",
        type=seconds,
        default=None,
        help="longest a request is held before it is let through anyway (default: the policy's: "
        f"{HOLD_TIMEOUT_S:g} s, ThunderAgent's, for every policy; keep it under "
        "your clients' request timeout)",
    )
    parser.add_argument(
        "--program-ttl",
        type=seconds,
        default=PROGRAM_TTL_S,
        help="forget a program that has sent no news for this long without a program.end "
        f"(default: {PROGRAM_TTL_S:g} s; the store keeps it)",
    )
    parser.add_argument(
        "--journal",
        action="store_true",
        help="keep the scheduler's decisions (admissions, placements, tier moves) for GET /v1/journal",
    )
    parser.add_argument(
        "--busy-margin",
        type=bounded(0.0, 1.0, open_low=True),
        default=None,
        help="maitred: share of GPU KV the expected busy set of admitted programs may fill "
        f"(default: {SignalConfig().busy_margin:g})",
    )
    parser.add_argument(
        "--overcommit-headroom",
        type=bounded(0.0, 10.0),
        default=None,
        help="maitred: admitted KV beyond what GPU and host memory keep, in GPUs; it is recomputed "
        f"when evicted (default: {SignalConfig().overcommit_headroom:g}; 0 never overcommits)",
    )
    parser.add_argument(
        "--priority",
        action="store_true",
        help="send SGLang request priorities (for --radix-eviction-policy priority; on with --launch-sglang)",
    )
    parser.add_argument("--no-warmups", action="store_true", help="never send prefill-only warmups")
    parser.add_argument(
        "--warmup-prompt-mb",
        type=_megabytes,
        default="4",
        help="largest last prompt kept per program for warmups; a larger one gets none (default: 4)",
    )
    parser.add_argument(
        "--warmup-prompts-mb",
        type=_megabytes,
        default="256",
        help="all prompts kept for warmups together; the least recently used go first (default: 256)",
    )
    parser.add_argument(
        "--warmup-prompts",
        type=whole(1, unit="whole number of programs"),
        default=10_000,
        help="programs whose last prompt is kept for warmups (default: 10,000)",
    )
    parser.add_argument(
        "--max-body-mb",
        type=_megabytes,
        default="32",
        help="largest model request body (default: 32, Anthropic's own limit; parsing one holds the "
        "gateway's interpreter about 2 ms per MB, stalling its other clients that long)",
    )
    parser.add_argument("--max-events-mb", type=_megabytes, default="16", help="largest event batch body (default: 16)")
    parser.add_argument(
        "--request-timeout", type=seconds, default=600.0, help="longest a worker may take to answer one request (default: 600 s)"
    )
    parser.add_argument(
        "--header-timeout",
        type=seconds,
        default=10.0,
        help="close a connection whose request headers are not complete this long after it opened "
        "(or after its previous answer) with 408 (default: 10 s)",
    )
    parser.add_argument(
        "--body-timeout",
        type=seconds,
        default=60.0,
        help="close a request whose body is not complete this long after its headers with 408 (default: 60 s)",
    )
    parser.add_argument(
        "--max-client-connections",
        type=whole(1, unit="whole number of connections"),
        default=None,
        help="client connections served at once; past it a new one displaces the one waiting longest for its "
        "request headers, or is answered 503 (default: half the file-descriptor limit less 128, at most 4096)",
    )
    parser.add_argument(
        "--wait-for-workers", type=seconds, default=30.0, help="at start, wait this long for a worker to answer (default: 30 s)"
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=seconds,
        default=SHUTDOWN_TIMEOUT_S,
        help="on SIGTERM, how long model requests in flight get to finish (new ones are refused with 503) "
        f"before the rest are ended with an error (default: {SHUTDOWN_TIMEOUT_S:g} s)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=seconds,
        default=DRAIN_TIMEOUT_S,
        help="at shutdown, how long queued events get to reach the store (retried while it is down); "
        f"what is left is counted and logged (default: {DRAIN_TIMEOUT_S:g} s)",
    )
    parser.add_argument(
        "--dedupe-events",
        type=whole(0, unit="whole number of events"),
        default=LiveConfig().recent_event_keys,
        metavar="N",
        help="an event re-sent among the last N ingested (a client retrying a batch) moves the live state "
        f"once, as the store stores it once; 0 turns this off (default: {LiveConfig().recent_event_keys:,})",
    )
    parser.add_argument(
        "--metrics-max-tools",
        type=whole(0, unit="whole number of tools"),
        default=MAX_TOOLS,
        metavar="N",
        help="tools given a label of their own in maitred_tool_duration_seconds, the N most called; the rest "
        f'are counted under tool="other" so clients cannot grow /metrics without bound (default: {MAX_TOOLS})',
    )
    parser.add_argument(
        "--shard",
        type=_shard_name,
        default=None,
        metavar="NAME",
        help="serve only while holding shard NAME's lease in the PostgreSQL --db: of the gateways started "
        "with the same NAME, store and workers one serves and the others stand by (/healthz 503) to take over",
    )
    parser.add_argument(
        "--lease-poll",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="with --shard: how often a standby tries the lease and the holder checks it; the longest a "
        f"takeover waits after the holder died (default: {LEASE_POLL_S:g} s)",
    )
    parser.add_argument(
        "--standby-hold",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="with --shard: a standby holds each model and event request while its next two tries of "
        "the lease tell whether the holder is gone, and serves it once it took over, at most SECONDS, "
        "instead of answering 503 at once: a balancer retrying a dead holder's requests there has them "
        "served after the takeover (default: 0, answer 503 at once)",
    )
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    parser.add_argument(
        "--launch-sglang",
        metavar="MODEL_PATH",
        help="start one SGLang server per GPU (see --gpus) as children, and route to them",
    )
    add_sglang_arguments(parser)


class _Refused(Exception):
    pass


def _config(args: argparse.Namespace, workers: Sequence[str]) -> "ServeConfig":
    from maitred.gateway.app import ServeConfig
    from maitred.gateway.origin import default_allowed_hosts
    from maitred.gateway.prompt_keep import PromptLimits
    from maitred.gateway.proxy_config import ProxyConfig
    from maitred.gateway.trust import Tokens, check_token_text

    sources = getattr(args, "config_sources", {})  # where each setting came from (maitred.config_file)
    token = args.token if args.token is not None else os.environ.get("MAITRED_TOKEN") or None
    if token is not None:
        check_token_text(token, sources.get("token", "--token") if args.token is not None else "MAITRED_TOKEN")
    tokens = Tokens.from_file(args.token_file, token) if args.token_file else Tokens.of(token)
    if args.host not in LOOPBACK and not tokens.required:
        raise _Refused(
            "--host: binding a non-loopback address needs --token, --token-file or MAITRED_TOKEN: "
            "every endpoint would be open to the network"
        )
    db = None
    if not args.no_db:
        from maitred.middleware.config import default_db_url

        db = args.db or default_db_url()
    elif args.db and sources.get("db", "--db") == "--db":  # over a database from $MAITRED_DB or a file, --no-db wins
        raise _Refused("--no-db: cannot be combined with --db")
    otlp = _otlp_endpoint(args.otlp_endpoint, sources.get("otlp_endpoint", "--otlp-endpoint"))
    shard = _shard(args, db, sources)
    sizing = {
        name: value
        for name, value in (("busy_margin", args.busy_margin), ("overcommit_headroom", args.overcommit_headroom))
        if value is not None
    }
    if sizing and args.policy != "maitred":
        flag = "--" + next(iter(sizing)).replace("_", "-")
        raise _Refused(f"{flag}: only the maitred policy sizes its GPU tier by the busy set (--policy {args.policy})")
    runtime = LiveConfig(
        policy=args.policy,
        tick_s=args.tick,
        hold_timeout_s=args.hold_timeout,
        program_ttl_s=args.program_ttl,
        priority=args.priority or bool(args.launch_sglang),
        warmups=not args.no_warmups,
        journal=args.journal,
        prompts=PromptLimits(args.warmup_prompt_mb, args.warmup_prompts_mb, args.warmup_prompts),
        recent_event_keys=args.dedupe_events,
        **sizing,
    )
    proxy = ProxyConfig(
        max_body_bytes=args.max_body_mb,
        request_timeout_s=args.request_timeout,
        forward_unknown_fields=args.forward_unknown_fields,
    )
    return ServeConfig(
        workers=list(workers),
        db_url=db,
        tokens=tokens,
        allowed_hosts=tuple(args.allowed_host) or default_allowed_hosts(args.host),
        runtime=runtime,
        proxy=proxy,
        max_events_bytes=args.max_events_mb,
        wait_for_workers_s=args.wait_for_workers,
        drain_timeout_s=args.drain_timeout,
        metrics_max_tools=args.metrics_max_tools,
        otlp_endpoint=otlp,
        shard=shard,
    )


def _shard(args: argparse.Namespace, db: str | None, sources: dict[str, str]) -> "ShardConfig | None":
    """``--shard``, ``--lease-poll`` and ``--standby-hold``: a lease needs a PostgreSQL store to be kept in.
    ``sources``: where each setting came from, to name it in a refusal."""
    from maitred.gateway.lease import lease_label
    from maitred.gateway.standby import ShardConfig

    if args.shard is None:
        for name, flag in (("lease_poll", "--lease-poll"), ("standby_hold", "--standby-hold")):
            if getattr(args, name) is not None:
                raise _Refused(f"{sources.get(name, flag)}: only with --shard (a gateway without a shard holds no lease)")
        return None
    shard = sources.get("shard", "--shard")
    if db is None:
        raise _Refused(f"{shard}: needs a PostgreSQL store to keep the lease in: --db postgresql://..., not --no-db")
    from sqlalchemy.engine import make_url

    from maitred.storage.engine import normalize_db_url
    from maitred.storage.errors import StoreError

    try:
        backend = make_url(normalize_db_url(db)).get_backend_name()
    except StoreError as exc:
        raise _Refused(f"--db: {exc}") from None
    if backend != "postgresql":
        given = sources.get("db", "--db" if args.db else "the default --db")
        raise _Refused(
            f"{shard}: needs a PostgreSQL --db to keep the lease in (--db postgresql://USER@HOST/DB), "
            f"not {backend} ({given}: {db})"
        )
    label = lease_label(args.shard, args.host, args.port)
    poll_s = args.lease_poll if args.lease_poll is not None else LEASE_POLL_S
    return ShardConfig(args.shard, label, poll_s, hold_s=args.standby_hold or 0.0)


def _otlp_url(text: str) -> str:
    """``--otlp-endpoint``'s type: an http(s) URL (the same check for a flag, a variable or a file)."""
    from maitred.middleware.otlp import traces_url

    try:
        traces_url(text, "URL")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("URL: ")) from None
    return text


def _otlp_endpoint(endpoint: str | None, where: str) -> str | None:
    """The export's endpoint, refused in one line naming ``where`` it came from when the otel
    extra is missing."""
    from maitred.middleware.otlp import require_otel

    if not endpoint:
        return None
    try:
        require_otel(where)
    except ImportError as exc:
        raise _Refused(str(exc)) from None
    return endpoint


def check_store(url: str) -> None:
    """Open the store once before serving, so a store that can never work (a driver that is not
    installed, a database written by a newer maitred, a damaged file) stops the start with one
    line instead of leaving a healthy-looking gateway that loses every event. A store that is
    only down (refused, unreachable, silent for 5 s) does not: the gateway serves and history
    waits for it (the store writer retries). Raises ``ValueError`` with the message."""
    from maitred.storage import SessionStore, StoreError, StoreUnavailable

    try:
        SessionStore(url, connect_timeout_s=5.0, read_timeout_s=5.0).close()
    except StoreUnavailable as exc:
        logging.getLogger("maitred.service").warning("maitred: store unavailable at start (%s); history waits for it", exc)
    except StoreError as exc:
        raise ValueError(f"--db: {exc}") from None


def _launch(args: argparse.Namespace) -> "SGLangLaunch":
    from maitred.gateway.sglang.launch import SGLangLaunch

    return SGLangLaunch(
        args.launch_sglang,
        args.gpus,
        host=args.sglang_host,
        base_port=args.sglang_base_port,
        hicache_ratio=args.hicache_ratio,
        extra_args=tuple(args.sglang_arg),
        python=args.sglang_python,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Returns the exit status."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Alembic narrates every migration check at INFO ("Will assume non-transactional DDL", which
    # reads like a warning); the store reports what matters itself.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))
    # httpx logs every answer at INFO, and --launch-sglang polls each server's /health with it
    # (``bind.wait_http``) every 50 ms until it is up
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        launch = _launch(args) if args.launch_sglang else None
        cfg = _config(args, [*args.worker, *(launch.urls() if launch else [])])
    except (_Refused, ValueError) as exc:
        return _refuse(str(exc))

    try:
        check_bindable(args.host, args.port)
        if cfg.db_url is not None:
            check_store(cfg.db_url)
    except ValueError as exc:
        print(f"maitred serve: error: {exc}", file=sys.stderr)
        return 1
    import uvicorn

    from maitred.gateway.app import build_app
    from maitred.gateway.connections import ConnectionLimits, guarded_protocol
    from maitred.gateway.proxy import CUT_GRACE_S
    from maitred.gateway.sglang.launch import ChildServers
    from maitred.gateway.shutdown import DrainingServer

    # The scheduler thread's policy step is CPU-bound Python; a shorter GIL switch interval (5 ms
    # by default) lets the event loop serve requests between its slices.
    sys.setswitchinterval(0.001)
    children = ChildServers(launch) if launch is not None else None
    try:
        if children is not None:
            children.start()
        gateway = build_app(
            cfg,
            on_shutdown=children.stop if children is not None else None,
            on_lease_lost=lambda: server.exit_now(),
        )
        config = uvicorn.Config(
            gateway.app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=round(CUT_GRACE_S),  # a backstop: the drain has ended every request
            timeout_keep_alive=KEEP_ALIVE_S,
            http=guarded_protocol(
                ConnectionLimits(args.header_timeout, args.body_timeout, max_connections=args.max_client_connections or 0)
            ),
        )
        server = DrainingServer(config, gateway.proxy, shutdown_timeout_s=args.shutdown_timeout)
        server.run()
        if not server.started:
            return 1  # the app could not start (uvicorn logged why)
        if gateway.shard is not None and gateway.shard.lost is not None:
            print(f"maitred serve: error: --shard {gateway.shard.cfg.name}: lease lost: {gateway.shard.lost}", file=sys.stderr)
            return 1
    except (TimeoutError, RuntimeError) as exc:
        print(f"maitred serve: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if children is not None:
            children.stop()
    return 0


def add_sglang_args_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``maitred sglang-args``."""
    parser.add_argument("model_path", metavar="MODEL_PATH", help="model to serve (a local folder or a hub name)")
    add_sglang_arguments(parser)


def run_sglang_args(args: argparse.Namespace) -> int:
    """Print the SGLang launch line for each GPU, for operators who start SGLang themselves,
    and the matching ``maitred serve`` line."""
    from maitred.gateway.sglang.launch import SGLangLaunch

    try:
        launch = SGLangLaunch(
            args.model_path,
            args.gpus,
            host=args.sglang_host,
            base_port=args.sglang_base_port,
            hicache_ratio=args.hicache_ratio,
            extra_args=tuple(args.sglang_arg),
            python=args.sglang_python,
        )
    except ValueError as exc:
        return _refuse(str(exc), command="sglang-args")
    for spec in launch.specs():
        print(spec.shell_line())
    print("maitred serve --priority " + " ".join(f"--worker {url}" for url in launch.urls()))
    return 0


def _refuse(message: str, *, command: str = "serve") -> int:
    print(f"maitred {command}: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m maitred.gateway.serve`` (the same as ``maitred serve``)."""
    parser = argparse.ArgumentParser(prog="maitred serve", description="the maitred gateway in front of SGLang workers")
    add_arguments(parser)
    CONFIG.layer(parser)
    try:
        return run_configured(run, parser.parse_args(argv))
    except ConfigError as exc:
        return _refuse(str(exc))


if __name__ == "__main__":
    sys.exit(main())
