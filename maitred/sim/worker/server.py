"""``maitred sim-worker``: a simulated SGLang server, a test and demo double — never a model.

It speaks the subset of SGLang 0.5.23's HTTP API that maitred, ``sglang-router`` and agent
clients use (``/v1/chat/completions``, ``/v1/completions``, Anthropic's ``/v1/messages`` and
``/v1/messages/count_tokens``, ``/v1/responses``, ``/generate`` including prefill-only
``max_new_tokens: 0``, ``/health``, ``/server_info``, ``/model_info``, ``/v1/models``,
``/v1/loads``, ``/metrics``) with SGLang's shapes, and answers with filler words. Timing, cache
hits, eviction and host offload come from the simulator's engine model
(``maitred.sim.engine``) run in real time × ``--time-scale``, so the gateway, the
integrations and the demo run end to end on a machine without a GPU. With ``--script-tools``
a request that offers ``tools`` (chat, Anthropic ``tool_use`` blocks, Responses
``function_call`` items) gets deterministic tool calls for a few steps and then a final answer,
so agent frameworks and Claude Code can run their loops through it.

This module runs one: ``SimWorkerThread`` and the command line. It imports nothing heavy at
import time (the ``maitred`` command builds every subcommand's parser on every call), so the app
and uvicorn load only when a worker starts. The server is in the modules beside it: ``config``
(the settings), ``state`` (one worker's state), ``app`` (the app and its information
endpoints), ``generation`` (generation endpoints), ``engine`` (the engine model against the
wall clock, and which program a prompt belongs to), ``tokens``, ``replies``, ``metrics`` and
``kv_events`` (optional KV-event publishing, ``--kv-events-config``).
"""

import argparse
import dataclasses
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maitred.bind import check_bindable
from maitred.config_file import ConfigSpec, run_configured
from maitred.flags import port, positive, whole
from maitred.sim.worker.config import MODEL_DIR, SERVED_MODEL_NAME, WRITE_POLICIES, SimWorkerConfig

if TYPE_CHECKING:
    import uvicorn

#: Every flag also as ``MAITRED_SIM_WORKER_<FLAG>`` and as a key of ``--config FILE``
#: (``maitred.config_file``); not ``MAITRED_<FLAG>``, which a gateway started from the same
#: shell reads (its ``MAITRED_PORT`` must not move the workers).
CONFIG = ConfigSpec("sim-worker", "MAITRED_SIM_WORKER_")


class SimWorkerThread:
    """A sim-worker served by uvicorn on a background thread, for tests, demos and benchmarks:
    ``with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=...)) as w: httpx.get(w.url + "/health")``.
    ``sim`` is the running worker (its engine model), for tests that look inside."""

    def __init__(self, config: SimWorkerConfig | None = None) -> None:
        self.config = config or SimWorkerConfig(port=0)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.sim: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self, timeout_s: float = 30.0) -> "SimWorkerThread":
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in self.config.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.config.host, self.config.port))
            self.config = dataclasses.replace(self.config, port=sock.getsockname()[1])
            from maitred.sim.worker.app import create_app

            app = create_app(self.config)
        except BaseException:
            sock.close()
            raise
        self.sim = app.state.sim
        self._server = server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"sim-worker :{self.config.port}"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sim-worker on {self.url} did not start within {timeout_s} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._server = self._thread = None

    def __enter__(self) -> "SimWorkerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- command line ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``maitred sim-worker`` (SPEC section 11, plus a few of SGLang's own names)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=port, default=30000, help="port to bind (default: 30000, SGLang's)")
    parser.add_argument(
        "--gpu-tokens",
        type=whole(1, unit="whole number of tokens"),
        help="GPU KV capacity in tokens (default: the engine profile's)",
    )
    parser.add_argument(
        "--cpu-tokens",
        type=whole(0, unit="whole number of tokens"),
        default=0,
        help="host (HiCache) KV capacity in tokens; 0 turns the host cache off (default: 0)",
    )
    parser.add_argument(
        "--time-scale",
        type=positive("factor"),
        default=1.0,
        help="run the engine this many times faster than the profiled GPU (default: 1)",
    )
    parser.add_argument(
        "--script-tools",
        action="store_true",
        help="answer requests that offer tools (chat, Anthropic messages, responses) with deterministic tool calls, then a final message",
    )
    parser.add_argument(
        "--script-steps",
        type=whole(0, unit="whole number of tokens"),
        default=3,
        help="tool-calling steps before the final message (default: 3)",
    )
    parser.add_argument(
        "--script",
        metavar="FILE",
        default=None,
        help="answer conversations that name a script (SCRIPT:<name> in their first user message) from this JSON "
        "file: exact tool calls, then a final text, so a real agent CLI runs a known session",
    )
    parser.add_argument(
        "--profile",
        help="engine profile: a JSON file (maitred calibrate writes one) or a built-in name (h100-7b, h200-7b, b200x2-70b)",
    )
    parser.add_argument(
        "--radix-eviction-policy",
        choices=("lru", "priority"),
        default="lru",
        help="as SGLang's flag: 'priority' evicts KV of lower request priority first (default: lru)",
    )
    parser.add_argument(
        "--hicache-write-policy",
        choices=WRITE_POLICIES,
        default="write_through",
        help="as SGLang's flag, with --cpu-tokens: write_through copies each block to host memory as it "
        "is cached, so host memory mirrors the GPU; write_back copies a block when it leaves the GPU "
        "and the eviction waits for the copy, so host memory adds to the GPU's (default: write_through)",
    )
    parser.add_argument(
        "--kv-events-config",
        metavar="JSON",
        help='as SGLang\'s flag: publish KV events, e.g. \'{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557"}\'',
    )
    parser.add_argument(
        "--model-path",
        default=str(MODEL_DIR),
        help="model folder reported to clients; must hold a tokenizer.json (default: the bundled word-level one)",
    )
    parser.add_argument(
        "--served-model-name", default=SERVED_MODEL_NAME, help=f"model name in responses (default: {SERVED_MODEL_NAME})"
    )
    parser.add_argument(
        "--abort-check",
        type=positive("number of seconds"),
        default=4.0,
        help="how often a non-streamed request checks that its client is still connected, and is aborted "
        "when not (SGLang's SGLANG_REQUEST_STATE_WAIT_TIMEOUT; default: 4 s)",
    )
    parser.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))


def config_from_args(args: argparse.Namespace) -> SimWorkerConfig:
    from maitred.sim.worker.session_script import load_script  # its tokenizer loads with the app

    return SimWorkerConfig(
        gpu_tokens=args.gpu_tokens,
        cpu_tokens=args.cpu_tokens,
        time_scale=args.time_scale,
        script_tools=args.script_tools,
        script_steps=args.script_steps,
        script=load_script(args.script) if args.script else None,
        profile=args.profile,
        model_path=args.model_path,
        served_model_name=args.served_model_name,
        radix_eviction_policy=args.radix_eviction_policy,
        hicache_write_policy=args.hicache_write_policy,
        kv_events_config=args.kv_events_config,
        host=args.host,
        port=args.port,
        abort_check_s=args.abort_check,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted. Bad settings raise ValueError naming the flag (exit status 1
    through the ``maitred`` command)."""
    config = config_from_args(args)
    if config.profile is not None:
        from maitred.sim.profile import EngineProfile

        try:
            EngineProfile.load(config.profile)
        except ValueError as exc:
            raise ValueError(f"--profile: {exc}") from None
    if not (Path(config.model_path) / "tokenizer.json").is_file():
        raise ValueError(f"--model-path {config.model_path}: no tokenizer.json there (sglang-router would try a model hub)")
    check_bindable(config.host, config.port)
    import uvicorn

    from maitred.sim.worker.app import create_app

    app = create_app(config)
    sys.stderr.write(f"maitred sim-worker: a simulated SGLang server (test double) on http://{config.host}:{config.port}\n")
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level, access_log=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m maitred.sim.worker``: the same as ``maitred sim-worker``."""
    parser = argparse.ArgumentParser(prog="maitred sim-worker", description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(parser)
    CONFIG.layer(parser)
    try:
        return run_configured(run, parser.parse_args(argv))
    except ValueError as exc:  # a ConfigError included
        sys.stderr.write(f"maitred: error: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
