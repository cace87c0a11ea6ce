"""``maitred.handoff``: control passes to another agent, with the context it inherits.

The runtime uses the shared messages to prefill the consumer's prompt before its first request
(LOCAL), so they travel with the event; the hash lets the store and runtime tell contexts apart
without keeping the messages themselves.
"""

import hashlib
import json
import logging
import time
from typing import Any

from maitred.events import Handoff
from maitred.middleware.config import emit
from maitred.middleware.context import scope

log = logging.getLogger("maitred")


def context_hash(messages: list[dict[str, Any]]) -> str:
    canonical = json.dumps(messages, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def handoff(
    to_agent: str,
    *,
    messages: list[dict[str, Any]] | None = None,
    child_program_id: str | None = None,
    context_tokens: int | None = None,
    expected_prompt: str | None = None,
    from_agent: str | None = None,
) -> None:
    """Record that the current agent hands control to ``to_agent`` (or to a child program)."""
    try:
        current = scope()
        emit(
            Handoff(
                ts=time.time(),
                program_id=current.program_id,
                agent=current.agent,
                from_agent=from_agent or current.agent or "main",
                to_agent=to_agent,
                child_program_id=child_program_id,
                messages=messages,
                context_tokens=context_tokens,
                context_hash=context_hash(messages) if messages else None,
                expected_prompt=expected_prompt,
            )
        )
    except Exception:
        log.debug("maitred: handoff not recorded", exc_info=True)
