"""The last prompt of each program, kept for prefill-only warmups, within fixed bounds.

A warmup replays a program's last prompt on the worker that should hold its KV (see
``LiveDriver._start_warmup``). Program ids come from clients, without a token, so what is kept
must not grow with what they send: a prompt larger than ``max_prompt_bytes`` is not kept, and
past ``max_prompts`` programs or ``max_total_bytes`` in all the least recently used prompt goes
first. A program whose prompt is gone simply gets no warmup; nothing else depends on it.

Sizes are what the interpreter holds, approximately: text at one byte per character, token ids
at ``ID_BYTES`` each (a list slot and an int object), chat messages at their text plus
``MESSAGE_BYTES`` each for the dicts that hold them.
"""

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from maitred.gateway.usage import PromptSize

#: What a driver keeps of a program's last prompt for a warmup: text, token ids, or chat messages
#: with their tools (rendered by the worker's ``/v1/tokenize`` when a warmup is sent).
Prompt = str | list[int] | tuple[list[dict[str, Any]], list[dict[str, Any]] | None]

ID_BYTES = 36  # an 8-byte list slot and a 28-byte int (ids above 256 are not shared)
MESSAGE_BYTES = 400  # a message's dict, its keys and the string headers of its values


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """Bounds on the prompts kept for warmups (``maitred serve --warmup-prompt-mb``,
    ``--warmup-prompts-mb``, ``--warmup-prompts``)."""

    max_prompt_bytes: int = 4 << 20  # 4 MiB: about a million tokens of text, past any context window
    max_total_bytes: int = 256 << 20
    max_prompts: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_prompt_bytes", "max_total_bytes", "max_prompts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")


def prompt_bytes(prompt: Prompt, size: PromptSize | None) -> int:
    """Approximately what keeping ``prompt`` costs in memory (see the module's note)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return ID_BYTES * len(prompt)
    messages, _tools = prompt
    chars = size.chars if size is not None and size.tokens is None else 0
    return chars + MESSAGE_BYTES * len(messages)


class PromptKeep:
    """Program id → its last prompt, least recently stored first, within ``PromptLimits``."""

    def __init__(self, limits: PromptLimits | None = None) -> None:
        self.limits = limits or PromptLimits()
        self._items: OrderedDict[str, tuple[Prompt, int]] = OrderedDict()
        self.total_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._items

    def get(self, program_id: str) -> Prompt | None:
        item = self._items.get(program_id)
        return None if item is None else item[0]

    def put(self, program_id: str, prompt: Prompt, nbytes: int) -> list[str]:
        """Keep ``prompt`` as ``program_id``'s last one, replacing its previous one. Returns the
        programs whose prompt is no longer kept: ``program_id`` itself when ``prompt`` is over
        ``max_prompt_bytes`` (its previous prompt is stale, so it goes too), and any evicted."""
        self.pop(program_id)
        if nbytes > self.limits.max_prompt_bytes:
            return [program_id]
        self._items[program_id] = (prompt, nbytes)
        self.total_bytes += nbytes
        evicted = []
        while len(self._items) > self.limits.max_prompts or self.total_bytes > self.limits.max_total_bytes:
            oldest, (_, size) = self._items.popitem(last=False)
            self.total_bytes -= size
            evicted.append(oldest)
        return evicted

    def pop(self, program_id: str) -> bool:
        """Forget ``program_id``'s prompt; whether one was kept."""
        item = self._items.pop(program_id, None)
        if item is None:
            return False
        self.total_bytes -= item[1]
        return True
