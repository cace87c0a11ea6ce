"""What the gateway checks of an Anthropic Messages request before it admits it.

SGLang refuses a malformed ``/v1/messages`` body too, but only once the request was admitted
and sent, and with a pydantic report; the gateway refuses it first, in Anthropic's error shape,
with the field named — the three fields SGLang's ``AnthropicMessagesRequest`` requires
(``model``, ``messages``, ``max_tokens``; ``count_tokens`` takes no ``max_tokens``). Everything
else (``system``, ``tools``, ``thinking``, ``metadata``, content blocks) is the worker's to read.
"""

from typing import Any

from maitred.gateway.guard import HTTPProblem

#: Roles of Messages API messages. ``system`` among them: Claude Code 2.1.3xx sends system
#: messages mid-conversation (``anthropic-beta: per-turn-control-2026-07-01``); the worker decides
#: whether it serves them.
MESSAGE_ROLES = ("user", "assistant", "system")


def check_anthropic_body(body: dict[str, Any], *, counting: bool) -> None:
    """Raise ``HTTPProblem`` (400) naming the first required field that is missing or wrong."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise HTTPProblem(400, f"model: expected the name of a model, got {model!r}", field="model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise HTTPProblem(400, "messages: expected a non-empty list of message objects", field="messages")
    for i, message in enumerate(messages):
        if message.get("role") not in MESSAGE_ROLES:
            raise HTTPProblem(400, f"messages[{i}].role: expected 'user', 'assistant' or 'system'", field=f"messages[{i}].role")
        if not isinstance(message.get("content"), str | list):
            raise HTTPProblem(
                400, f"messages[{i}].content: expected a string or a list of content blocks", field=f"messages[{i}].content"
            )
    if counting:
        return
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise HTTPProblem(400, f"max_tokens: expected a positive integer, got {max_tokens!r}", field="max_tokens")
