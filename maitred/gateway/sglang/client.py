"""SGLang worker backend: what the gateway learns from an SGLang server, and how it asks.

Shapes are SGLang 0.5.23's (python/sglang/srt/...):

- ``GET /server_info`` (``entrypoints/http_server.py``: ``server_info``): the resolved server
  arguments (``model_path``, ``dp_size``, ``enable_hierarchical_cache``, ``hicache_ratio``,
  ``hicache_size``, ``hicache_write_policy``, ...) merged with the scheduler's start-up info
  (``max_total_num_tokens``, per data-parallel rank) and ``internal_states``, one dict per rank
  whose ``memory_usage.token_capacity`` is that rank's KV pool in tokens
  (``managers/scheduler_components/internal_state.py``). ``/get_server_info`` is the deprecated
  alias, still answered.
- ``GET /v1/loads`` (``entrypoints/v1_loads.py``): ``{timestamp, version, accelerator,
  num_accelerators, loads: [...]}`` with one ``LoadSnapshot.to_dict()`` per rank
  (``managers/load_snapshot.py``: ``num_running_reqs``, ``num_waiting_reqs``,
  ``num_used_tokens``, ``token_usage``, ``cache_hit_rate``, ...).
- Cache hits per request: ``meta_info.cached_tokens`` (and ``cached_tokens_details`` ``{device,
  host[, storage]}`` when any were cached) from ``/generate``
  (``managers/tokenizer_manager.py``), ``usage.prompt_tokens_details.cached_tokens`` from the
  OpenAI endpoints when the server runs with ``--enable-cache-report``
  (``entrypoints/openai/protocol.py``: ``UsageInfo``).
- ``GET /metrics`` (``--enable-metrics``): ``sglang:hicache_host_total_tokens`` is the host pool.
- ``POST /v1/tokenize`` (``entrypoints/openai/serving_tokenize.py``): ``messages`` (and ``tools``)
  rendered by the model's chat template, as for a chat completion or, with
  ``add_generation_prompt: false``, as given: ``{tokens, count, max_model_len}``.

A warmup is a prefill-only ``/generate`` with ``max_new_tokens: 0``: the OpenAI endpoints
refuse zero tokens, so a chat-shaped prefix is warmed by tokenizing its messages first
(``tokenize``) and sending the ids. No SGLang endpoint pins or evicts one
prefix; eviction is steered only through per-request ``priority``.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from maitred.gateway.sglang.kv_events import KVEventError, endpoints_from_server_info

__all__ = [
    "SGLangClient",
    "WorkerCapacity",
    "WorkerError",
    "WorkerLoad",
    "WorkerProtocolError",
    "WorkerRequestError",
    "cached_tokens",
    "parse_host_capacity",
    "parse_loads",
    "parse_server_info",
]

HOST_TOTAL_METRIC = "sglang:hicache_host_total_tokens"


class WorkerError(Exception):
    """A worker could not tell what it was asked (``WorkerRequestError``, ``WorkerProtocolError``)."""


class WorkerProtocolError(WorkerError, ValueError):
    """A worker answered with a body that does not have the shape SGLang gives it; the
    message names the field."""


class WorkerRequestError(WorkerError):
    """A request to a worker failed: no connection, a timeout, or an answer other than 2xx
    (``status``; None when there was no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class WorkerCapacity:
    """KV capacity of one SGLang server, in tokens.

    ``gpu_tokens`` is the sum over its data-parallel ranks (each rank has its own pool, so one
    program's KV never exceeds ``gpu_tokens // dp_size``). ``host_tokens`` is the HiCache host
    pool: 0 when HiCache is off, None when ``/server_info`` cannot tell (a pool sized in GB);
    ``host_capacity()`` reads the exact figure from ``/metrics``. ``write_policy`` is HiCache's
    ``--hicache-write-policy`` (``write_through``, SGLang's default, ``write_back`` or
    ``write_through_selective``): None when HiCache is off or the server does not say.
    """

    gpu_tokens: int
    host_tokens: int | None
    dp_size: int
    model_path: str | None
    write_policy: str | None = None

    @property
    def write_back(self) -> bool:
        """Blocks reach host memory only when they leave the GPU, so the host pool adds to the
        GPU's instead of mirroring it (``WorkerState.write_back``)."""
        return self.write_policy == "write_back"


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """Load of one SGLang server, summed over its data-parallel ranks.

    ``token_usage`` is the busiest rank's (SGLang's own field is a max over pools, so a max
    over ranks keeps its meaning: how close the fullest pool is to full); ``cache_hit_rate``
    is the mean over the ranks that report one.
    """

    running: int
    waiting: int
    used_tokens: int
    token_usage: float
    cache_hit_rate: float | None
    ranks: int


def _field(body: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in body:
        raise WorkerProtocolError(f"{where}: missing field {name!r}")
    return body[name]


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WorkerProtocolError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _ratio(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise WorkerProtocolError(f"{where}: expected a non-negative number, got {value!r}")
    return float(value)


def _object(body: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise WorkerProtocolError(f"{where}: expected a JSON object, got {type(body).__name__}")
    return body


def _rank_capacities(body: Mapping[str, Any]) -> list[int]:
    states = body.get("internal_states")
    if states is None:
        return []
    if not isinstance(states, list):
        raise WorkerProtocolError(f"server_info.internal_states: expected a list, got {type(states).__name__}")
    capacities = []
    for i, state in enumerate(states):
        where = f"server_info.internal_states[{i}]"
        memory = _object(state, where).get("memory_usage")
        if memory is None:
            continue
        where += ".memory_usage"
        capacities.append(_count(_field(_object(memory, where), "token_capacity", where), where + ".token_capacity"))
    return capacities


def _host_tokens(body: Mapping[str, Any], gpu_tokens: int) -> int | None:
    if not body.get("enable_hierarchical_cache", False):
        return 0
    size_gb = body.get("hicache_size") or 0
    ratio = body.get("hicache_ratio")
    if size_gb or ratio is None:  # sized in GB, or a ratio SGLang picks itself: /metrics knows
        return None
    return round(_ratio(ratio, "server_info.hicache_ratio") * gpu_tokens)


def _write_policy(body: Mapping[str, Any]) -> str | None:
    policy = body.get("hicache_write_policy")
    if policy is not None and not isinstance(policy, str):
        raise WorkerProtocolError(f"server_info.hicache_write_policy: expected a string, got {policy!r}")
    return policy if body.get("enable_hierarchical_cache", False) else None


def parse_server_info(body: dict) -> WorkerCapacity:
    """Capacity from a ``/server_info`` body: per-rank ``internal_states[].memory_usage.token_capacity``
    summed, else ``max_total_num_tokens`` (a per-rank figure) times ``dp_size``."""
    info = _object(body, "server_info")
    dp_size = info.get("dp_size", 1)
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise WorkerProtocolError(f"server_info.dp_size: expected a positive integer, got {dp_size!r}")
    ranks = _rank_capacities(info)
    if ranks:
        gpu_tokens = sum(ranks)
    elif "max_total_num_tokens" in info:
        gpu_tokens = _count(info["max_total_num_tokens"], "server_info.max_total_num_tokens") * dp_size
    else:
        raise WorkerProtocolError(
            "server_info: neither max_total_num_tokens nor internal_states[].memory_usage.token_capacity is present"
        )
    model_path = info.get("model_path")
    if model_path is not None and not isinstance(model_path, str):
        raise WorkerProtocolError(f"server_info.model_path: expected a string, got {model_path!r}")
    per_rank = gpu_tokens // dp_size
    host = _host_tokens(info, per_rank)
    return WorkerCapacity(gpu_tokens, None if host is None else host * dp_size, dp_size, model_path, _write_policy(info))


def parse_loads(body: dict) -> WorkerLoad:
    """Load from a ``/v1/loads`` envelope, summed over its ``loads`` entries (one per rank)."""
    loads = _field(_object(body, "loads envelope"), "loads", "loads envelope")
    if not isinstance(loads, list) or not loads:
        raise WorkerProtocolError(f"loads envelope.loads: expected a non-empty list, got {loads!r}")
    running = waiting = used = 0
    usage = 0.0
    hits: list[float] = []
    for i, entry in enumerate(loads):
        where = f"loads[{i}]"
        entry = _object(entry, where)
        running += _count(_field(entry, "num_running_reqs", where), where + ".num_running_reqs")
        waiting += _count(_field(entry, "num_waiting_reqs", where), where + ".num_waiting_reqs")
        used += _count(_field(entry, "num_used_tokens", where), where + ".num_used_tokens")
        usage = max(usage, _ratio(_field(entry, "token_usage", where), where + ".token_usage"))
        if entry.get("cache_hit_rate") is not None:
            hits.append(_ratio(entry["cache_hit_rate"], where + ".cache_hit_rate"))
    return WorkerLoad(running, waiting, used, usage, sum(hits) / len(hits) if hits else None, len(loads))


def cached_tokens(response: dict) -> int | None:
    """Prompt tokens served from cache for one response, or None when the worker did not say.

    OpenAI shape: ``usage.prompt_tokens_details.cached_tokens`` (absent without
    ``--enable-cache-report``). ``/generate`` shape: ``meta_info.cached_tokens``, or the sum of
    ``meta_info.cached_tokens_details`` (device + host + storage) when only that is given.
    Works on a streaming chunk too (the last one carries the usage).
    """
    body = _object(response, "response")
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, Mapping) and details.get("cached_tokens") is not None:
            return _count(details["cached_tokens"], "usage.prompt_tokens_details.cached_tokens")
    meta = body.get("meta_info")
    if isinstance(meta, Mapping):
        if meta.get("cached_tokens") is not None:
            return _count(meta["cached_tokens"], "meta_info.cached_tokens")
        split = meta.get("cached_tokens_details")
        if isinstance(split, Mapping):
            return sum(_count(split.get(k, 0), f"meta_info.cached_tokens_details.{k}") for k in ("device", "host", "storage"))
    return None


def parse_host_capacity(metrics_text: str) -> int | None:
    """Host KV pool in tokens from Prometheus text (``sglang:hicache_host_total_tokens``, summed
    over its label sets: one per rank), or None when the metric is absent (HiCache off or
    ``--enable-metrics`` not set)."""
    total: float | None = None
    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name == HOST_TOTAL_METRIC:
                    if not math.isfinite(sample.value) or sample.value < 0:
                        raise WorkerProtocolError(f"{HOST_TOTAL_METRIC}: expected a non-negative number, got {sample.value}")
                    total = (total or 0.0) + sample.value
    except ValueError as exc:
        if isinstance(exc, WorkerProtocolError):
            raise
        raise WorkerProtocolError(f"metrics: not Prometheus text ({exc})") from None
    return None if total is None else int(total)


class SGLangClient:
    """One SGLang server seen through HTTP. ``session`` gives the caller's aiohttp session (a
    shared connection pool, opened inside the serving event loop, so it is asked for at each
    call); each call sets its own timeout, and a redirect is an answer, not followed (a worker
    that redirects ``/health`` is not healthy). Control-plane requests go through aiohttp as
    model requests do: a poll through httpx cost about three times the CPU (``proxy``)."""

    def __init__(
        self,
        url: str,
        session: Callable[[], aiohttp.ClientSession],
        *,
        timeout_s: float = 5.0,
        health_timeout_s: float = 1.0,
        warmup_timeout_s: float = 60.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._health_timeout = aiohttp.ClientTimeout(total=health_timeout_s)
        self._warmup_timeout = aiohttp.ClientTimeout(total=warmup_timeout_s)

    def __repr__(self) -> str:
        return f"SGLangClient({self.url!r})"

    async def _ask(self, method: str, path: str, timeout: aiohttp.ClientTimeout, body: Any = None) -> bytes:
        """The body of a 2xx answer to ``method path``; ``WorkerRequestError`` otherwise."""
        data = None if body is None else orjson.dumps(body)
        headers = None if body is None else {"content-type": "application/json"}
        try:
            async with self._session().request(
                method, self.url + path, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as r:
                content = await r.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise WorkerRequestError(f"{self.url}{path}: {type(exc).__name__} {exc}".rstrip()) from None
        if not 200 <= r.status < 300:
            raise WorkerRequestError(f"{self.url}{path}: answered {r.status}", r.status)
        return content

    async def _get_json(self, path: str) -> Any:
        content = await self._ask("GET", path, self._timeout)
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError:
            raise WorkerProtocolError(f"{self.url}{path}: body is not JSON") from None

    async def server_info(self) -> Any:
        """``/server_info``; ``/get_server_info`` when the server predates the new name (404)."""
        try:
            return await self._get_json("/server_info")
        except WorkerRequestError as exc:
            if exc.status != 404:
                raise
            return await self._get_json("/get_server_info")

    async def capacity(self) -> WorkerCapacity:
        return parse_server_info(await self.server_info())

    async def kv_event_endpoints(self) -> list[str]:
        """Where this worker publishes KV events (one ZMQ endpoint per data-parallel rank; empty
        without ``--kv-events-config``), for ``kv_events.KVEventSubscriber``."""
        try:
            return endpoints_from_server_info(self.url, await self.server_info())
        except KVEventError as exc:
            raise WorkerProtocolError(str(exc)) from None

    async def load(self) -> WorkerLoad:
        return parse_loads(await self._get_json("/v1/loads"))

    async def healthy(self) -> bool:
        """``GET /health`` answers 200 within the short timeout. Never raises."""
        try:
            async with self._session().get(self.url + "/health", timeout=self._health_timeout, allow_redirects=False) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def warmup(self, text_or_input_ids: str | list[int], *, priority: int | None = None) -> int | None:
        """Prefill ``text_or_input_ids`` without generating (``max_new_tokens: 0``) so the next real
        request finds it cached (or loads it back from host memory). Returns the tokens that
        were already cached, as the worker reports them."""
        body: dict[str, Any] = {"sampling_params": {"max_new_tokens": 0}}
        if isinstance(text_or_input_ids, str):
            body["text"] = text_or_input_ids
        else:
            body["input_ids"] = list(text_or_input_ids)
        if priority is not None:
            body["priority"] = priority
        content = await self._ask("POST", "/generate", self._warmup_timeout, body)
        try:
            payload = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise WorkerProtocolError(f"{self.url}/generate: body is not JSON") from None
        return cached_tokens(payload)

    async def tokenize(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = False
    ) -> list[int]:
        """Token ids of ``messages`` under the worker's own chat template (``POST /v1/tokenize``).
        Without the generation prompt (the default) they are a prefix of any request that
        continues these messages, so ``warmup(ids)`` warms exactly what that request will reuse."""
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        if tools:
            body["tools"] = tools
        content = await self._ask("POST", "/v1/tokenize", self._timeout, body)
        try:
            tokens = orjson.loads(content)["tokens"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise WorkerProtocolError(f"{self.url}/v1/tokenize: expected a JSON object with 'tokens'") from None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise WorkerProtocolError(f"{self.url}/v1/tokenize: tokens must be a list of integers")
        return tokens

    async def host_capacity(self) -> int | None:
        content = await self._ask("GET", "/metrics", self._timeout)
        return parse_host_capacity(content.decode("utf-8", "replace"))
