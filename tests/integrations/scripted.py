"""A chat model that answers from a script: real LangChain plumbing, no network, no randomness."""

from collections.abc import Iterable
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="the langgraph extra is not installed")

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import PrivateAttr


# Two tools the scripted agents call, shared by the LangGraph and OpenTelemetry tests.
@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def grep(pattern: str) -> str:
    """Search the code."""
    return f"cart.py:12: {pattern}"


def calls(*names_and_ids: tuple[str, str], args: dict[str, Any] | None = None, tokens: tuple[int, int] = (120, 8)) -> AIMessage:
    """An assistant turn that calls tools (parallel when several): ``calls(("add", "call_1"))``."""
    return AIMessage(
        content="",
        tool_calls=[
            {"name": name, "args": dict(args or {}), "id": call_id, "type": "tool_call"} for name, call_id in names_and_ids
        ],
        usage_metadata={
            "input_tokens": tokens[0],
            "output_tokens": tokens[1],
            "total_tokens": sum(tokens),
            "input_token_details": {"cache_read": tokens[0] // 2},
        },
    )


def answer(text: str, tokens: tuple[int, int] = (150, 12)) -> AIMessage:
    return AIMessage(
        content=text, usage_metadata={"input_tokens": tokens[0], "output_tokens": tokens[1], "total_tokens": sum(tokens)}
    )


class ScriptedChatModel(BaseChatModel):
    """Returns the scripted messages in order (then repeats the last) and remembers the keyword
    arguments of each call (what ``model_settings`` put on the request)."""

    script: list[AIMessage]
    model_name: str = "scripted"
    _next: int = PrivateAttr(default=0)
    _seen: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def seen_kwargs(self) -> list[dict[str, Any]]:
        return self._seen

    def bind_tools(self, tools: Iterable[Any], **kwargs: Any) -> Any:
        kwargs.pop("tool_choice", None)
        return self.bind(**kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self._seen.append(kwargs)
        message = self.script[min(self._next, len(self.script) - 1)]
        self._next += 1
        return ChatResult(generations=[ChatGeneration(message=message.model_copy())])
