"""A Dynamo stack on 127.0.0.1 for tests and benchmarks: ``dynamo.mocker`` workers, Dynamo's
frontend and one of three routers in front of the same workers.

- ``kv``: Dynamo's KV router inside the frontend (``--router-mode kv``); the workers register
  the public model name themselves.
- ``thunderagent``: ``dynamo.thunderagent_router`` as a component; the workers register under
  ``<model>-workers`` (topology only), the router registers the public name, and the frontend
  round-robins to it (``--router-mode round-robin``).
- ``maitred``: maitred's component (``python -m maitred.gateway.dynamo``), wired the same way,
  with maitred's HTTP surface (``POST /v1/events``, ``GET /v1/programs``) on ``admin_port``.

Everything runs with file discovery, the ZMQ event plane and the TCP request plane, bound to
127.0.0.1, from ``python`` (an interpreter where Dynamo is installed: the mocker's engine, the
frontend and the routers are Dynamo's own programs). Each process runs in its own process group
and is stopped (SIGTERM, then SIGKILL of the group) when the stack's ``ExitStack`` closes.

``write_model`` makes the folder the mocker and the frontend load: a Llama-shaped
``config.json`` (the mocker sizes KV bytes per token from it) and a word-level tokenizer whose
vocabulary holds the words ``maitred.harness.livedemo`` writes prompts with, so each prompt
word is its own token and two programs' prompts differ token by token (the mocker's prefix cache
and the KV router's overlap see real prefixes, not one unknown token repeated).
"""

import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from maitred.harness.background import free_port

ROUTERS = ("kv", "thunderagent", "maitred")
MODEL = "sim"
NAMESPACE = "dynamo"
WORKER_ENDPOINT = f"dyn://{NAMESPACE}.backend.generate"
PLANES = ("--discovery-backend", "file", "--event-plane", "zmq", "--request-plane", "tcp")
_SPECIALS = ["[UNK]", "<|im_start|>", "<|im_end|>"]
_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_model(folder: Path) -> Path:
    """The model folder (see the module docstring); no weights, and not a model."""
    folder.mkdir(parents=True, exist_ok=True)
    words = [f"{letter}{n:03d}" for letter in "abcdefghijklmnopqrstuvwxyz" for n in range(1000)]
    words += ["system", "user", "assistant", "tool", "ok", "done", ".", ",", ":"]
    vocab = {token: i for i, token in enumerate(_SPECIALS + words)}
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, t in enumerate(_SPECIALS)
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    config = {
        "_comment": "A test double for Dynamo's mocker: no weights; sizes only for its KV arithmetic.",
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "torch_dtype": "float16",
        "max_position_embeddings": 131072,
        "vocab_size": len(vocab),
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "unk_token": "[UNK]",
        "eos_token": "<|im_end|>",
        "chat_template": _TEMPLATE,
    }
    for name, body in (("tokenizer.json", tokenizer), ("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        (folder / name).write_text(json.dumps(body))
    return folder


def dynamo_env(root: Path) -> dict[str, str]:
    """Dynamo's settings for a stack on 127.0.0.1 with file discovery under ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env.update(
        DYN_FILE_KV=str(root / "discovery"),
        DYN_DISCOVERY_BACKEND="file",
        DYN_EVENT_PLANE="zmq",
        DYN_REQUEST_PLANE="tcp",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
        DYN_SELF_HOST_METADATA="0",
        DYN_LOG="warn",
    )
    return env


class Process:
    """A child in its own process group, its output in ``log``."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with status {code}:\n{self.output()}")

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@dataclass(frozen=True)
class MockerSpec:
    """The mocker workers: how many, their KV pool and speed."""

    workers: int = 2
    gpu_blocks: int = 2048  # per worker
    block_size: int = 16
    speedup: float = 10.0  # the mocker's --speedup-ratio
    extra: tuple[str, ...] = ()


@dataclass
class Stack:
    router: str
    url: str  # the frontend, OpenAI-compatible
    root: Path
    python: str
    mocker: MockerSpec
    processes: list[Process] = field(default_factory=list)
    admin_url: str | None = None  # maitred's HTTP surface (``router == "maitred"``)

    @property
    def worker_name(self) -> str:
        """The model name the workers register (the public one only under Dynamo's KV router)."""
        return MODEL if self.router == "kv" else f"{MODEL}-workers"

    def spawn(self, name: str, argv: list[str], stack: ExitStack) -> Process:
        process = Process(name, argv, self.root / f"{name}.log", dynamo_env(self.root))
        stack.callback(process.stop)
        self.processes.append(process)
        return process

    def add_worker(self, stack: ExitStack) -> Process:
        """One more mocker worker like the others (Dynamo's discovery announces it)."""
        spec, n = self.mocker, sum(p.name.startswith("mocker") for p in self.processes)
        return self.spawn(
            f"mocker{n}",
            [
                self.python,
                *("-m", "dynamo.mocker", "--model-path", str(self.root / "model"), "--model-name", self.worker_name, *PLANES),
                *("--num-gpu-blocks-override", str(spec.gpu_blocks), "--block-size", str(spec.block_size)),
                *("--speedup-ratio", f"{spec.speedup:g}", *spec.extra),
            ],
            stack,
        )

    def check(self) -> None:
        for p in self.processes:
            p.check()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.output()}" for p in self.processes)


def _wait_ready(stack: Stack, timeout_s: float) -> None:
    """Until the frontend lists the model and answers one chat request through the router."""
    deadline = time.monotonic() + timeout_s
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ok"}], "max_tokens": 1}
    last = "no answer"
    while time.monotonic() < deadline:
        stack.check()
        try:
            models = httpx.get(stack.url + "/v1/models", timeout=2.0).json().get("data") or []
            if any(m.get("id") == MODEL for m in models):
                r = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=10.0)
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:200]}"
        except (httpx.HTTPError, ValueError) as exc:
            last = repr(exc)
        time.sleep(0.3)
    raise RuntimeError(f"the {stack.router} stack did not answer within {timeout_s:g} s ({last}):\n{stack.logs()}")


def start_stack(
    router: str,
    python: str,
    root: Path,
    stack: ExitStack,
    *,
    mocker: MockerSpec = MockerSpec(),
    maitred_args: Sequence[str] = (),
    ready_timeout_s: float = 120.0,
) -> Stack:
    """Workers, router and frontend for ``router`` (one of ``ROUTERS``), under ``root``."""
    if router not in ROUTERS:
        raise ValueError(f"router: one of {', '.join(ROUTERS)}, got {router!r}")
    root.mkdir(parents=True, exist_ok=True)
    model = write_model(root / "model")
    port = free_port()
    running = Stack(router, f"http://127.0.0.1:{port}", root, python, mocker)

    def spawn(name: str, argv: list[str]) -> None:
        running.spawn(name, argv, stack)

    planes = list(PLANES)
    for _ in range(mocker.workers):
        running.add_worker(stack)
    if router == "thunderagent":
        spawn(
            "thunderagent",
            [
                python,
                *("-m", "dynamo.thunderagent_router", "--endpoint", WORKER_ENDPOINT.removeprefix("dyn://")),
                *("--model-name", MODEL, "--model-path", str(model), "--router-block-size", str(mocker.block_size)),
            ],
        )
    elif router == "maitred":
        admin = free_port()
        running.admin_url = f"http://127.0.0.1:{admin}"
        spawn(
            "maitred",
            [
                python,
                *("-m", "maitred.gateway.dynamo", "--endpoint", WORKER_ENDPOINT, "--model-name", MODEL),
                *("--model-path", str(model), "--min-workers", str(mocker.workers), "--http-port", str(admin), *planes),
                *maitred_args,
            ],
        )
    mode = "kv" if router == "kv" else "round-robin"
    spawn(
        "frontend",
        [python, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port), *planes, "--router-mode", mode],
    )
    _wait_ready(running, ready_timeout_s)
    return running
