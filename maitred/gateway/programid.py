"""Which program a model request belongs to (SPEC 7.5), and what the worker must not see of it.

In order: body ``program_id``, ``extra_body.program_id``, ``metadata.program_id``, then the
headers ``X-Program-Id``, ``x-litellm-session-id``, ``X-Claude-Code-Session-Id``. Every
body location is stripped before forwarding (workers reject or ignore unknown fields; SGLang's
OpenAI protocol forbids some), emptied containers with it. Behind a LiteLLM proxy the id only
arrives as the top-level body ``program_id`` (LiteLLM forwards neither client headers nor body
``metadata``), which is where maitred's LiteLLM callback puts it.
"""

from collections.abc import Mapping
from typing import Any

from maitred.events import MAX_ID_LENGTH, PROGRAM_ID_HEADERS
from maitred.gateway.guard import HTTPProblem


def _valid(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise HTTPProblem(
            400, f"{where}: expected a string of 1 to {MAX_ID_LENGTH} characters, got {str(value)[:64]!r}", field=where
        )
    return value


def _pop_nested(body: dict[str, Any], container: str) -> Any:
    inner = body.get(container)
    if not isinstance(inner, dict) or "program_id" not in inner:
        return None
    value = inner.pop("program_id")
    if not inner:
        del body[container]
    return value


def take_program_id(body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str | None, bool]:
    """The program id (None: a one-step program) and whether ``body`` was changed. Every body
    location is stripped, also those after the one that wins."""
    found: str | None = None
    changed = False
    if "program_id" in body:
        found = _valid(body.pop("program_id"), "program_id")
        changed = True
    for container in ("extra_body", "metadata"):
        value = _pop_nested(body, container)
        if value is not None:
            changed = True
            checked = _valid(value, f"{container}.program_id")
            found = found or checked
    if found is None:
        for name in PROGRAM_ID_HEADERS:
            value = headers.get(name)
            if value is not None:
                found = _valid(value, name)
                break
    return found, changed
