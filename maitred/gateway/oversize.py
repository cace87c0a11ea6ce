"""Refusing at once a prompt no worker can hold.

A prompt larger than every worker's GPU KV capacity can never be admitted: held, it would wait
out the whole hold bound and then be refused by the worker anyway. The gateway answers 400 at
once instead, naming the prompt's size and the largest capacity.

The gateway counts a prompt before any tokenizer does, so the check must never refuse one a
worker would take: token ids are counted exactly, and text is counted at no fewer than
``MAX_CHARS_PER_TOKEN`` characters per token (or the program's own learned ratio, if higher) —
more than tokenizers put into one token of ordinary text — so the count is a lower bound.
"""

from collections.abc import Mapping
from typing import Any

from maitred.gateway.guard import HTTPProblem
from maitred.gateway.usage import PromptSize
from maitred.runtime.records import WorkerState

MAX_CHARS_PER_TOKEN = 8.0
#: Where each API puts its prompt, for the error's ``field``.
PROMPT_FIELDS = ("input_ids", "messages", "input", "prompt", "text")


def check_fits(
    body: Mapping[str, Any], size: PromptSize | None, workers: Mapping[str, WorkerState], chars_per_token: float | None
) -> None:
    """Raise a 400 ``HTTPProblem`` when the prompt is larger than every worker's GPU capacity
    (workers whose capacity is not known yet are not counted; with none known, nothing is refused)."""
    known = [(w.gpu_tokens, url) for url, w in workers.items() if w.gpu_tokens > 0]
    if size is None or not known:
        return
    capacity, url = max(known)
    if size.tokens is not None:
        tokens, how = size.tokens, f"{size.tokens:,} tokens"
    else:
        tokens = int(size.chars / max(MAX_CHARS_PER_TOKEN, chars_per_token or 0.0))
        how = f"at least {tokens:,} tokens (estimated from {size.chars:,} characters)"
    if tokens <= capacity:
        return
    field = next((f for f in PROMPT_FIELDS if f in body), "body")
    raise HTTPProblem(
        400,
        f"{field}: the prompt is {how}, more than the largest worker's KV capacity of {capacity:,} tokens "
        f"({url}): no worker can hold it",
        field=field,
    )
