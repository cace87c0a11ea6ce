"""``GET /v1/models``: the models the gateway's workers serve, in OpenAI's list shape.

The gateway asks every worker that is up (SGLang's own ``/v1/models``) and answers the union,
one entry per model id, as the first worker to name it describes it: a client (OpenAI's SDK,
Codex CLI) that lists models before it asks sees what it can ask for, whichever worker its
program lands on.
"""

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response

from maitred.gateway.guard import error_response

#: The longest one worker may take to list its models.
MODELS_TIMEOUT_S = 5.0


async def _models_of(session: aiohttp.ClientSession, worker: str) -> list[dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
    async with session.get(worker + "/v1/models", timeout=timeout) as response:
        response.raise_for_status()
        body = orjson.loads(await response.read())
    data = body.get("data") if isinstance(body, dict) else None
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] if isinstance(data, list) else []


async def list_models(session: aiohttp.ClientSession, workers: Sequence[str]) -> Response:
    """The union of what ``workers`` serve; 503 when none is up, 502 when none answered."""
    if not workers:
        return error_response(503, "no worker is up to say which models it serves", kind="service_unavailable")
    answers = await asyncio.gather(*(_models_of(session, url) for url in workers), return_exceptions=True)
    models: dict[str, dict[str, Any]] = {}
    for answer in answers:
        if not isinstance(answer, BaseException):
            for entry in answer:
                models.setdefault(entry["id"], entry)
    if all(isinstance(a, BaseException) for a in answers):
        failures = "; ".join(f"{url}: {type(a).__name__}" for url, a in zip(workers, answers))
        return error_response(502, f"no worker listed its models ({failures})", kind="bad_gateway")
    return Response(orjson.dumps({"object": "list", "data": list(models.values())}), media_type="application/json")
