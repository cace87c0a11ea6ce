"""A LiteLLM proxy with two worker deployments, maitred deciding where each program runs.

Starts two sim-workers and a maitred gateway here (the runtime the callback asks), then the
LiteLLM proxy with ``config.yaml`` (its api_bases pointed at the sim-workers), and sends a few
requests for two programs, naming each program in a different way, and a Claude Code-shaped
session (Anthropic ``/v1/messages``, the session in ``x-claude-code-session-id``). Every request
of a program lands on the worker the runtime assigned it, streaming or not.

    python examples/litellm_proxy/run.py
"""

import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx

from maitred.harness.background import free_port, wait_http
from maitred.harness.local import local_cluster

CONFIG = Path(__file__).with_name("config.yaml")


def request(proxy: str, key: str, program: str, how: str, stream: bool) -> str:
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": f"{program}: refactor the billing module"}],
        "max_tokens": 16,
        "stream": stream,
    }
    headers = {"authorization": f"Bearer {key}"}
    if how == "metadata":
        body["metadata"] = {"program_id": program}
    else:
        headers["x-program-id"] = program
    with httpx.stream("POST", f"{proxy}/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
        r.read()
        r.raise_for_status()
        return r.headers["x-litellm-model-api-base"].rstrip("/").removesuffix("/v1")


def claude_code_turn(proxy: str, key: str, session: str) -> str:
    """One model call as Claude Code sends it to a proxy (``ANTHROPIC_BASE_URL``)."""
    body = {
        "model": "sim",
        "max_tokens": 16,
        "stream": True,
        "metadata": {"user_id": f"user_0_account__session_{session}"},
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}],
        "messages": [{"role": "user", "content": "run the tests"}],
    }
    headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01", "x-claude-code-session-id": session}
    with httpx.stream("POST", f"{proxy}/v1/messages", json=body, headers=headers, timeout=120) as r:
        r.read()
        r.raise_for_status()
        return r.headers["x-litellm-model-api-base"].rstrip("/").removesuffix("/v1")


def main() -> None:
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cluster = stack.enter_context(local_cluster(db_url=f"sqlite:///{folder}/maitred.db", script_tools=False))
        config = folder / "config.yaml"
        config.write_text(
            CONFIG.read_text()
            .replace("http://127.0.0.1:30001", cluster.worker_urls[0])
            .replace("http://127.0.0.1:30002", cluster.worker_urls[1])
        )
        port, key = free_port(), "sk-" + secrets.token_hex(16)
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MAITRED_URL": cluster.gateway_url,
        }
        print("starting the LiteLLM proxy (this takes a while) ...", flush=True)
        log = stack.enter_context(open(folder / "proxy.log", "w"))
        proxy = subprocess.Popen(
            [str(Path(sys.executable).with_name("litellm")), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stack.callback(proxy.wait, 30)
        stack.callback(proxy.terminate)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health/liveliness", timeout_s=300, process=proxy)
        for program, how in (("billing-refactor", "metadata"), ("docs-update", "header")):
            landed = [request(url, key, program, how, stream) for stream in (False, True, False)]
            assigned = httpx.get(f"{cluster.gateway_url}/v1/programs/{program}").json()["worker"]
            print(f"{program:<17} named by {how:<8} landed on {landed}; the runtime assigned {assigned}")
        session = str(uuid.uuid4())
        landed = [claude_code_turn(url, key, session) for _ in range(3)]
        assigned = httpx.get(f"{cluster.gateway_url}/v1/programs/{session}").json()["worker"]
        print(f"Claude Code session {session[:8]} on /v1/messages landed on {landed}; the runtime assigned {assigned}")


if __name__ == "__main__":
    main()
