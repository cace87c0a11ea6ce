"""LiteLLM proxy (litellm 1.110): maitred schedules the programs behind a LiteLLM proxy (SPEC 8).

Register the callback in the proxy's ``config.yaml``::

    litellm_settings:
      callbacks: maitred.integrations.litellm.maitred_logger

and give each worker its own deployment with a stable ``model_info.id``
(``examples/litellm_proxy/config.yaml``). With a runtime (``MAITRED_URL``, a ``maitred serve``
over the same workers) each request of a program:

1. ``async_pre_call_hook``: the program id is taken from the body (``program_id``, or
   ``metadata.program_id``) or the requester's headers (``X-Program-Id``,
   ``x-litellm-session-id``, ``X-Claude-Code-Session-Id``, which Claude Code sends on
   ``/v1/messages``). The hook asks the runtime for
   admission (``POST /v1/admit``, which records the ``llm.start``): the runtime answers at once
   when the program fits, else when a scheduling step admits it or its hold bound passes (then
   it goes anyway, like the gateway's forced admission), with the program's worker. It writes
   ``program_id`` into the forwarded body, because LiteLLM forwards neither client headers nor
   ``metadata`` to a deployment, and the program id and worker into the proxy's metadata
   (``_proxy_metadata``), where the later hooks of the request find them.
2. ``async_filter_deployments``: keeps the deployment whose normalised ``api_base`` is the
   program's worker, on every request, streaming included; if none matches, all are kept (a
   scheduling hint never fails a request).
3. ``async_log_success_event`` / ``async_log_failure_event``: the ``llm.end`` with prompt,
   completion and cached tokens (``standard_logging_object.metadata.usage_object
   .prompt_tokens_details.cached_tokens``; ``cache_hit`` there is LiteLLM's response cache, not
   prefix caching) and the deployment that served it, sent through the middleware's emitter (to
   the runtime, which persists it, or to the store without one).

LiteLLM decides which hooks a callback implements by looking at the class (``vars(cls)``), so
each hook is defined here on ``MaitredLogger`` itself, not inherited.

Importing this module sets ``LITELLM_LOCAL_MODEL_COST_MAP=True`` unless the environment says
otherwise: without it, importing LiteLLM downloads a model price list from the internet.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

# Before LiteLLM's first import (which, without it, fetches its price list over the network); a
# proxy has imported LiteLLM before loading its callbacks, so it needs the variable set itself.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm.integrations.custom_logger import CustomLogger

from maitred.events import LLMEnd
from maitred.identity import client_program_id, program_header
from maitred.middleware.config import emit

__all__ = ["MaitredLogger", "llm_end_of", "maitred_logger", "normalize_base", "program_id_of"]

log = logging.getLogger("maitred")

#: Where the hook leaves what it decided, for the later hooks of the same request.
_WORKER_KEY = "maitred_worker"
_PROGRAM_KEY = "maitred_program_id"


#: The endpoint paths LiteLLM appends to a deployment's ``api_base`` when it reports where a
#: call went (``standard_logging_object.api_base``) for most providers other than ``openai/``.
_ENDPOINT_PATHS = ("/chat/completions", "/completions", "/messages", "/responses")


def normalize_base(url: str | None) -> str | None:
    """The worker's base URL, as ``maitred serve --worker`` names it: ``http://127.0.0.1:30000/v1/``,
    ``http://127.0.0.1:30000/v1/messages`` and ``http://127.0.0.1:30000`` are one worker. The
    runtime keys a worker's KV residency by this name, so every spelling must map to it."""
    if not url:
        return None
    text = url.strip().rstrip("/").lower()
    for path in _ENDPOINT_PATHS:
        if text.endswith(path):
            text = text[: -len(path)]
            break
    return text[: -len("/v1")] if text.endswith("/v1") else text


def _proxy_metadata(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The proxy's own metadata of a request: the requester's headers, what LiteLLM adds, and
    what the maitred hooks leave for the later hooks. On the routes of LiteLLM's
    ``LITELLM_METADATA_ROUTES`` (``/v1/messages``, ``/v1/responses``, ...) it is
    ``litellm_metadata``, because ``metadata`` there is the provider's own body field (Anthropic's
    ``{"user_id": ...}``, which Claude Code always sends); elsewhere it is ``metadata``. LiteLLM
    creates ``litellm_metadata`` only on those routes, so its presence decides."""
    for key in ("litellm_metadata", "metadata"):
        value = data.get(key)
        if isinstance(value, dict):
            return value
    return None


def program_id_of(data: Mapping[str, Any]) -> str | None:
    """The program a proxied request belongs to: body ``program_id``, ``metadata.program_id``,
    then the ids clients already send (``maitred.identity``: the requester's headers, which the
    proxy keeps in its metadata, and body fields such as Claude Code's ``metadata.user_id``).
    The one place the callback reads a program id, on every route."""
    metadata = _proxy_metadata(data) or {}
    for value in (
        data.get("program_id"),
        metadata.get(_PROGRAM_KEY),
        metadata.get("program_id"),
        (metadata.get("requester_metadata") or {}).get("program_id"),
    ):
        if isinstance(value, str) and value:
            return value
    headers = {str(k).lower(): v for k, v in (metadata.get("headers") or {}).items()}
    sent = client_program_id(data, headers)  # the ids clients already send (maitred.identity)
    return sent[0] if sent is not None and isinstance(sent[0], str) and sent[0] else None


def _cached_tokens(usage: Any) -> int | None:
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else getattr(usage, "prompt_tokens_details", None)
    value = details.get("cached_tokens") if isinstance(details, Mapping) else getattr(details, "cached_tokens", None)
    return value if isinstance(value, int) else None


class MaitredLogger(CustomLogger):
    """The LiteLLM proxy callback. ``runtime_url`` defaults to ``$MAITRED_URL``; without one, only
    the llm events are recorded (to the store) and nothing is held or routed."""

    def __init__(self, runtime_url: str | None = None, *, token: str | None = None, admission_timeout_s: float = 60.0) -> None:
        super().__init__()
        self._runtime_url = runtime_url
        self._token = token
        self.admission_timeout_s = admission_timeout_s
        self._client: httpx.AsyncClient | None = None
        self._down = False  # reported once per outage, not once per request

    @property
    def runtime_url(self) -> str | None:
        url = self._runtime_url or os.environ.get("MAITRED_URL")
        return url.rstrip("/") if url else None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            token = self._token or os.environ.get("MAITRED_TOKEN")
            headers = {"authorization": f"Bearer {token}"} if token else {}
            self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(5.0, connect=2.0))
        return self._client

    # -- before the call ------------------------------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        try:
            program_id = program_id_of(data)
            if program_id is None:
                return data
            data["program_id"] = program_id
            metadata = _proxy_metadata(data)
            if metadata is None:  # called outside the proxy, with no metadata of its own
                metadata = data.setdefault("metadata", {})
            metadata[_PROGRAM_KEY] = program_id
            url = self.runtime_url
            if url is not None:
                worker = await self._admitted(url, program_id, data)
                if worker is not None:
                    metadata[_WORKER_KEY] = worker
        except Exception:  # a scheduling hint never fails the request
            log.warning("maitred: admission skipped for this request", exc_info=True)
        return data

    async def _admitted(self, url: str, program_id: str, data: Mapping[str, Any]) -> str | None:
        """Ask the runtime for admission (``POST /v1/admit``, with ``X-Program-Id`` so a balancer
        sends it to the program's shard): it answers once the program may run, with its worker; the runtime bounds the wait (its hold bound), and so does
        ``admission_timeout_s``. A runtime that is down or refuses us is never waited on."""
        body: dict[str, Any] = {"program_id": program_id, "request_id": str(data.get("litellm_call_id") or uuid.uuid4())}
        if isinstance(data.get("model"), str):
            body["model"] = data["model"]
        try:
            response = await self._http().post(
                f"{url}/v1/admit", json=body, headers=program_header(program_id), timeout=self.admission_timeout_s
            )
            response.raise_for_status()
            worker = response.json().get("worker")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            if not self._down:
                self._down = True
                log.warning("maitred: runtime at %s unavailable, requests go unscheduled until it answers (%s)", url, exc)
            return None
        if self._down:
            self._down = False
            log.warning("maitred: runtime at %s reachable again", url)
        return normalize_base(worker) if isinstance(worker, str) else None

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages: Any,
        request_kwargs: dict | None = None,
        parent_otel_span: Any = None,
    ) -> list:
        try:
            worker = (_proxy_metadata(request_kwargs or {}) or {}).get(_WORKER_KEY)
            if not worker:
                return healthy_deployments
            chosen = [d for d in healthy_deployments if normalize_base((d.get("litellm_params") or {}).get("api_base")) == worker]
            return chosen or healthy_deployments
        except Exception:
            log.debug("maitred: deployment filter skipped", exc_info=True)
            return healthy_deployments

    # -- after the call -------------------------------------------------------------------------

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._record(kwargs, "ok")

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._record(kwargs, "error")

    def _record(self, kwargs: Mapping[str, Any], status: str) -> None:
        try:
            event = llm_end_of(kwargs, status)
            if event is not None:
                emit(event)
        except Exception:
            log.debug("maitred: llm.end not recorded", exc_info=True)


def llm_end_of(kwargs: Mapping[str, Any], status: str) -> LLMEnd | None:
    """The ``llm.end`` of one logged LiteLLM call; None when it names no program."""
    params = kwargs.get("litellm_params") or {}
    program_id = program_id_of({"metadata": params.get("metadata") or {}, "program_id": kwargs.get("program_id")})
    if program_id is None:
        return None
    slo = kwargs.get("standard_logging_object") or {}
    metadata = slo.get("metadata") or {}
    usage = metadata.get("usage_object") or {}
    ttft = None
    started, first = slo.get("startTime"), slo.get("completionStartTime")
    if isinstance(started, (int, float)) and isinstance(first, (int, float)) and first >= started:
        ttft = float(first - started)
    return LLMEnd(
        ts=time.time(),
        program_id=program_id,
        request_id=str(kwargs.get("litellm_call_id") or slo.get("id") or uuid.uuid4()),
        prompt_tokens=int(slo.get("prompt_tokens") or 0),
        completion_tokens=int(slo.get("completion_tokens") or 0),
        cached_tokens=_cached_tokens(usage),
        worker=normalize_base(slo.get("api_base") or params.get("api_base")),
        ttft_s=ttft,
        status=status,  # type: ignore[arg-type]
    )


#: The instance ``config.yaml`` names: ``litellm_settings.callbacks: maitred.integrations.litellm.maitred_logger``.
#: Building it does no I/O: the runtime URL is read, and the HTTP client made, on first use.
maitred_logger = MaitredLogger()
