"""Requests through a Dynamo stack's frontend, and what maitred's component says of them."""

from typing import Any

import httpx

from maitred.harness.dynamo_stack import MODEL


def words(seed: int, n: int) -> str:
    """``n`` words of the stack's tokenizer: ``n`` tokens, different for each ``seed``."""
    letter = "abcdefghijklmnopqrstuvwxyz"[seed % 26]
    return " ".join(f"{letter}{(seed * 7919 + i * 31) % 1000:03d}" for i in range(n))


def chat(url: str, messages: list[dict[str, Any]], *, session: str | None, max_tokens: int = 8, **headers: str) -> httpx.Response:
    """One chat request asking for the component's ``engine_data`` (``nvext.extra_fields``)."""
    if session is not None:
        headers["x-dynamo-session-id"] = session
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "nvext": {"extra_fields": ["engine_data"]}}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


def decided(response: httpx.Response) -> dict[str, Any]:
    """What maitred's component put in the answer: program, chosen and serving instance, wait."""
    response.raise_for_status()
    return response.json()["nvext"]["engine_data"]["maitred"]


def metric(admin_url: str, name: str) -> float:
    text = httpx.get(admin_url + "/metrics", timeout=10).text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")
    )
